/* The earnings page: a daily earnings chart and balances, updated as the server pushes them
   (live.js), so new earnings appear as they are credited. */
"use strict";

(function () {
  const url = document.getElementById("earnings-page").dataset.liveUrl;
  let chart = null;
  let lastKey = "";

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  function render(d) {
    const key = JSON.stringify(d);
    if (key === lastKey) return;
    lastKey = key;
    // one point per day, at noon UTC so that the day's label sits under it
    const xs = d.series.map(function (p) { return Date.parse(p[0] + "T12:00:00Z") / 1000; });
    const ys = d.series.map(function (p) { return Number(p[1]); });
    if (!chart) {
      const el = document.getElementById("chart-earnings");
      chart = new uPlot({
        width: Math.max(240, el.getBoundingClientRect().width), height: 240,
        scales: { x: { time: true } },
        axes: [{ stroke: "#646b82", grid: { stroke: "#eceef5" } }, { stroke: "#646b82", grid: { stroke: "#eceef5" }, size: 60 }],
        series: [{}, { label: "earned", stroke: "#12a150", fill: "rgba(18,161,80,.12)", width: 2,
          value: function (u, v) { return v == null ? "—" : v.toFixed(4); } }],
      }, [xs, ys], el);
      new ResizeObserver(function () {
        chart.setSize({ width: Math.max(240, el.getBoundingClientRect().width), height: 240 });
      }).observe(el);
    } else {
      chart.setData([xs, ys]);
    }
    if (d.balances) {
      document.getElementById("e-earnings").textContent = d.balances.earnings;
      document.getElementById("e-pending").textContent = d.balances.pending_payouts;
      document.getElementById("e-paid").textContent = d.balances.paid_out;
    }
    document.getElementById("e-tasks").textContent = d.tasks_done;
    const rows = d.by_node.map(function (r) {
      return "<tr><td>" + esc(r.node_name) + '</td><td class="num">' + esc(r.tasks) + '</td><td class="num">' + esc(r.amount) + "</td></tr>";
    });
    document.getElementById("by-node").innerHTML = rows.length ? rows.join("") :
      '<tr><td colspan="3" class="empty">Nothing earned yet.</td></tr>';
  }

  render(JSON.parse(document.getElementById("earnings-data").textContent));
  GPUFlexLive.follow({
    streamUrl: document.getElementById("earnings-page").dataset.eventsUrl,
    pollUrl: url, pollMs: 2000, onData: render,
  });
})();
