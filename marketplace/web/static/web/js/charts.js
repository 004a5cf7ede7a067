/* Small helpers around uPlot (vendored, see static/web/vendor/) shared by the pages. */
"use strict";

window.GFCharts = (function () {
  const COLORS = ["#4f46e5", "#12a150", "#d98e04", "#d93a3a", "#0ea5e9"];

  function width(el) {
    return Math.max(240, Math.floor(el.getBoundingClientRect().width));
  }

  /* A line chart that follows its container's width. series: [{label, color?}], data: uPlot data. */
  function line(el, series, data, opts) {
    opts = opts || {};
    const config = {
      width: width(el),
      height: opts.height || 240,
      cursor: { drag: { x: false, y: false } },
      // a single series needs no legend: the card's title names it
      legend: { show: series.length > 1 },
      scales: { x: { time: false, distr: opts.logX ? 3 : 1 }, y: opts.yRange ? { range: opts.yRange } : {} },
      axes: [
        { label: opts.xLabel || "", stroke: "#646b82", grid: { stroke: "#eceef5" }, ticks: { stroke: "#e3e6ef" },
          // rounds are whole numbers: no ticks at 1.25
          incrs: opts.integerX ? [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] : undefined },
        { label: opts.yLabel || "", stroke: "#646b82", grid: { stroke: "#eceef5" }, ticks: { stroke: "#e3e6ef" },
          size: 50 },
      ],
      series: [{ label: opts.xLabel || "x" }].concat(series.map(function (s, i) {
        return {
          label: s.label,
          stroke: s.color || COLORS[i % COLORS.length],
          width: 2,
          spanGaps: !!opts.spanGaps,
          points: { show: true, size: 5 },
          value: function (u, v) { return v == null ? "—" : (opts.format ? opts.format(v) : v); },
        };
      })),
    };
    const chart = new uPlot(config, data, el);
    new ResizeObserver(function () { chart.setSize({ width: width(el), height: config.height }); }).observe(el);
    return chart;
  }

  return { line: line, COLORS: COLORS };
})();
