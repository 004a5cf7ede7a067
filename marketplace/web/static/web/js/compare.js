/* The comparison page: accuracy against simulated time for each method, on a log time axis
   (the methods differ by orders of magnitude). uPlot needs one shared x, so each method's
   points are merged onto the union of times, with gaps elsewhere that spanGaps joins. */
"use strict";

(function () {
  const data = JSON.parse(document.getElementById("compare-data").textContent);
  const colors = { naive_sync: "#d93a3a", fedavg: "#d98e04", network_aware: "#4f46e5" };
  data.scenarios.forEach(function (s) {
    const xs = Array.from(new Set([].concat.apply([], s.methods.map(function (m) { return m.times; }))))
      .sort(function (a, b) { return a - b; });
    const ys = s.methods.map(function (m) {
      const at = new Map(m.times.map(function (t, i) { return [t, m.accuracy[i]]; }));
      return xs.map(function (t) { return at.has(t) ? at.get(t) : null; });
    });
    GFCharts.line(document.getElementById("chart-" + s.key),
      s.methods.map(function (m) { return { label: m.label, color: colors[m.key] }; }),
      [xs].concat(ys), { logX: true, xLabel: "simulated seconds", yRange: [0, 1], height: 260, spanGaps: true,
        format: function (v) { return v.toFixed(3); } });
  });
})();
