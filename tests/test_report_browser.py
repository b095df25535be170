"""The report in a real browser: headless Chromium opens the file, with no network.

Checks what only a browser can: the page raises no console errors, every chart is painted
(a screenshot of it has many colours, not a blank box), the numbers the browser shows are
those the commands print with ``--json``, the tooltips and zoom respond, and print media
hides the controls. Skips only where Chromium is not installed (CI installs it).
"""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest

from simulator.explain.report_sections import lookup

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
MIN_COLOURS = 6  # a painted chart: axes, text, marks in several colours, background
# Installed before the page loads: uncaught errors and failed loads, seen from inside.
ERROR_HOOK = """
window.__errors = [];
window.addEventListener("error", function (e) {
  window.__errors.push(String(e.message || ("failed to load " + (e.target && (e.target.src ||
                                                                         e.target.href)))));
}, true);
window.addEventListener("unhandledrejection", function (e) {
  window.__errors.push("unhandled rejection: " + e.reason);
});
"""

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists() or not (CHROMEDRIVER.exists() or shutil.which("chromedriver")),
    reason="Chromium and chromedriver are not installed (Debian: chromium chromium-driver)",
)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from test_report import make_report

    path, _ = make_report(tmp_path_factory.mktemp("browser-report"))
    return path


@pytest.fixture(scope="module")
def browser(tmp_path_factory, report):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    profile = tmp_path_factory.mktemp("chromium-profile")
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                "--window-size=1280,900", "--hide-scrollbars"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = CHROMEDRIVER if CHROMEDRIVER.exists() else shutil.which("chromedriver")
    driver = webdriver.Chrome(service=Service(str(driver_path)), options=opts)
    try:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": ERROR_HOOK})
        driver.get(report.resolve().as_uri())
        yield driver
    finally:
        driver.quit()


def colours(png: bytes) -> int:
    """Distinct RGB colours of a PNG screenshot."""
    import numpy as np
    from matplotlib.image import imread

    rgb = (imread(io.BytesIO(png), format="png")[..., :3] * 255).astype(np.uint8)
    return len(np.unique(rgb.reshape(-1, 3), axis=0))


def test_no_console_errors(browser):
    logs = browser.get_log("browser")
    assert [e for e in logs if e["level"] == "SEVERE"] == [], logs
    assert browser.execute_script("return window.__errors;") == []
    # The page's script ran to its last line: the data download link points at a blob.
    href = browser.find_element("id", "download-json").get_attribute("href")
    assert href.startswith("blob:")


def test_every_chart_is_painted(browser):
    from test_report import CHART_IDS

    for chart_id in CHART_IDS:
        el = browser.find_element("id", chart_id)
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
        size = el.size
        assert size["width"] > 300 and size["height"] > 150, (chart_id, size)
        assert colours(el.screenshot_as_png) >= MIN_COLOURS, chart_id


def test_numbers_shown_are_the_commands_json(browser):
    from test_report import PROBLEM, TILING, D, tilesim_json

    data = browser.execute_script(
        "return JSON.parse(document.getElementById('tilesim-data').textContent);")
    spans = browser.execute_script(
        "return Array.from(document.querySelectorAll('[data-key]')).map(e => "
        "[e.dataset.key, e.dataset.value, e.textContent]);")
    assert len(spans) > 80
    for key, raw, text in spans:
        assert json.loads(raw) == lookup(data, key), key
        assert text.strip() and "NaN" not in text and "undefined" not in text, key
    commands = {
        "roofline": tilesim_json(["roofline", *PROBLEM, *TILING]),
        "bill": tilesim_json(["bill", "--seq", ",".join(str(r["seq"])
                                                         for r in data["bill"]["rows"]),
                              "--head-dim", str(D), "--dtype", "bf16"]),
        "ledger": tilesim_json(["ledger", "--seq", "64", "--tile", "16", "--seed", "0"]),
    }
    shown = 0
    for key, raw, _ in spans:
        section, _, rest = key.partition(".")
        if section in commands:
            assert json.loads(raw) == lookup(commands[section], rest), key
            shown += 1
    assert shown > 40
    ridge = "roofline.ceilings.ridge_points.tensor"
    assert json.loads(dict((k, v) for k, v, _ in spans)[ridge]) == 989e12 / 3.35e12


def test_tooltip_and_zoom(browser):
    from selenium.webdriver.common.action_chains import ActionChains

    point = browser.find_element("css selector", "#chart-roofline path.pt")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", point)
    ActionChains(browser).move_to_element(point).perform()
    tip = browser.find_element("id", "tip")
    assert tip.is_displayed() and "intensity" in tip.text and "FLOP/B" in tip.text

    heatmap = browser.find_element("id", "chart-heatmap")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", heatmap)
    view_box = "return arguments[0].getAttribute('viewBox');"
    before = browser.execute_script(view_box, heatmap)
    heatmap.find_element("xpath", "..").find_element("css selector", ".toolbar button").click()
    after = browser.execute_script(view_box, heatmap)
    assert float(after.split()[2]) == pytest.approx(float(before.split()[2]) / 1.6, rel=1e-6)

    timeline = browser.find_element("id", "chart-timeline")
    ticks = timeline.find_element("css selector", "g.zoom-ticks").get_attribute("innerHTML")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", timeline)
    timeline.find_element("xpath", "..").find_element("css selector", ".toolbar button").click()
    layer = timeline.find_element("css selector", "g.zoom-layer")
    scale = re.search(r"scale\(([0-9.e+-]+),1\)", layer.get_attribute("transform"))
    assert scale and float(scale.group(1)) == pytest.approx(1.6, rel=1e-9)
    assert timeline.find_element("css selector", "g.zoom-ticks").get_attribute(
        "innerHTML") != ticks


def test_print_media_hides_controls(browser):
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    try:
        assert not browser.find_element("css selector", "nav").is_displayed()
        assert not browser.find_element("css selector", ".toolbar").is_displayed()
        assert browser.find_element("id", "chart-roofline").is_displayed()
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})
