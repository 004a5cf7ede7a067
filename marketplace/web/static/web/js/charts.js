/* Small helpers around uPlot (vendored, see static/web/vendor/) shared by the pages. */
"use strict";

window.GFCharts = (function () {
  const COLORS = ["#4f46e5", "#12a150", "#d98e04", "#d93a3a", "#0ea5e9"];

  /* Tick labels with the fewest decimals that show each tick as it is: 0.0005, 0.0010, 0.0015
     rather than uPlot's 0.001, 0.001, 0.002 for a provider's small earnings; 0, 1, 2 for whole
     numbers. Labels that say their value exactly are also distinct, as the ticks are. */
  function tickLabels(splits) {
    for (let d = 0; d <= 10; d++) {
      const labels = splits.map(function (v) { return v == null ? "" : v.toFixed(d); });
      const exact = splits.every(function (v, i) {
        return v == null || Math.abs(Number(labels[i]) - v) <= 1e-9 * Math.max(1, Math.abs(v));
      });
      if (exact && new Set(labels).size === labels.length) return labels;
    }
    return splits.map(function (v) { return v == null ? "" : String(v); });
  }

  function axisValues(u, splits) { return tickLabels(splits); }

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
          size: 50, values: axisValues },
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

  return { line: line, tickLabels: tickLabels, axisValues: axisValues, COLORS: COLORS };
})();
