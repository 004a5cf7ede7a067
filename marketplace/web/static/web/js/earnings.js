/* The earnings page: a daily earnings chart and balances, updated as the server pushes them
   (live.js), so new earnings appear as they are credited. */
"use strict";

(function () {
  const url = document.getElementById("earnings-page").dataset.liveUrl;
  let chart = null;
  let lastKey = "";
  let series = [];

  function readout(idx) {
    // the day under the cursor, its amount as the server formats money (desktop/money.py)
    const p = idx == null ? null : series[idx];
    document.getElementById("earnings-readout").textContent = p ? p[0] + ": " + p[2] + " credits earned" :
      "Point at a day to read what it earned.";
  }

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
    series = d.series;
    if (!chart) {
      const el = document.getElementById("chart-earnings");
      chart = new uPlot({
        width: Math.max(240, el.getBoundingClientRect().width), height: 240,
        scales: { x: { time: true } },
        // one series: the card's title names it, and the line below reads the day hovered
        // (uPlot's own legend read "Time: -- earned: —" until one hovered)
        legend: { show: false },
        axes: [{ stroke: "#646b82", grid: { stroke: "#eceef5" } },
          { stroke: "#646b82", grid: { stroke: "#eceef5" }, size: 70, values: GFCharts.axisValues }],
        series: [{}, { label: "earned", stroke: "#12a150", fill: "rgba(18,161,80,.12)", width: 2 }],
        hooks: { setCursor: [function (u) { readout(u.cursor.idx); }] },
      }, [xs, ys], el);
      new ResizeObserver(function () {
        chart.setSize({ width: Math.max(240, el.getBoundingClientRect().width), height: 240 });
      }).observe(el);
    } else {
      chart.setData([xs, ys]);
    }
    if (d.shown) {
      document.getElementById("e-earnings").textContent = d.shown.earnings;
      // unverified work's earnings wait out their payout hold (docs/money.md)
      document.getElementById("e-available").textContent = d.shown.earnings_available;
      document.getElementById("e-held").textContent = d.shown.earnings_held;
      document.getElementById("e-pending").textContent = d.shown.pending_payouts;
      document.getElementById("e-paid").textContent = d.shown.paid_out;
    }
    document.getElementById("e-tasks").textContent = d.tasks_done;
    const rows = d.by_node.map(function (r) {
      return "<tr><td>" + esc(r.node_name) + '</td><td class="num">' + esc(r.tasks) + '</td><td class="num">' + esc(r.shown) + "</td></tr>";
    });
    // the same words as the page's first paint (earnings.html)
    document.getElementById("by-node").innerHTML = rows.length ? rows.join("") :
      '<tr><td colspan="3" class="empty">' + (d.tasks_done ?
        "Nothing credited yet: tasks are paid once their results are verified." : "Nothing earned yet.") + "</td></tr>";
    readout(null);
  }

  render(JSON.parse(document.getElementById("earnings-data").textContent));
  GPUFlexLive.follow({
    streamUrl: document.getElementById("earnings-page").dataset.eventsUrl,
    pollUrl: url, pollMs: 2000, onData: render,
  });
})();
