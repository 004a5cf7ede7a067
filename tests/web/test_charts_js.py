"""The charts' helpers (static/web/js/charts.js) run in Debian's chromium, without a server:
tick labels that stay apart however small the figures (the earnings chart's y-axis read
0.002, 0.002, 0.001, 0.001 for a provider's first earnings)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.web.test_browser import CHROMIUM

STATIC = Path(__file__).resolve().parents[2] / "marketplace" / "web" / "static" / "web"

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")


@pytest.fixture(scope="module")
def page() -> Iterator:
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        tab = browser.new_page()
        tab.set_content("<!doctype html><div id=c></div>")
        tab.add_script_tag(path=str(STATIC / "vendor" / "uPlot.iife.min.js"))
        tab.add_script_tag(path=str(STATIC / "js" / "charts.js"))
        yield tab
        browser.close()


@pytest.mark.parametrize(
    ("splits", "labels"),
    [
        ([0.0005, 0.001, 0.0015, 0.002], ["0.0005", "0.0010", "0.0015", "0.0020"]),
        ([0, 0.00025, 0.0005], ["0.00000", "0.00025", "0.00050"]),
        ([0, 1, 2, 3], ["0", "1", "2", "3"]),
        ([0, 0.2, 0.4], ["0.0", "0.2", "0.4"]),
        ([1000, 1500, 2000], ["1000", "1500", "2000"]),
    ],
)
def test_tick_labels_are_distinct_with_the_fewest_decimals(page, splits, labels) -> None:
    assert page.evaluate("(s) => GFCharts.tickLabels(s)", splits) == labels


def test_a_chart_draws_its_y_axis_with_distinct_labels(page) -> None:
    """uPlot calls the axis formatter (as the earnings chart sets it) with the splits it chose
    for a provider's small daily earnings."""
    ticks = page.evaluate(
        """async () => {
          const el = document.getElementById("c");
          let drawn = null;
          const chart = new uPlot({
            width: 400, height: 240, scales: { x: { time: true } },
            axes: [{}, { values: function (u, s) { return (drawn = GFCharts.axisValues(u, s)); } }],
            series: [{}, { label: "earned" }],
          }, [[1700000000, 1700086400, 1700172800], [0.0011, 0.0014, 0.0021]], el);
          await new Promise(requestAnimationFrame);
          chart.destroy();
          return drawn;
        }"""
    )
    assert len(ticks) >= 3 and len(set(ticks)) == len(ticks)
    assert all(float(t) == pytest.approx(round(float(t), 6)) for t in ticks)
