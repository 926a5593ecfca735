"""Headless Chromium for the tests of HTML pages: Debian's chromium and chromium-driver
(``make browser``), driven by selenium and, for what selenium lacks (blocking the network,
moving the mouse to a pixel), the DevTools protocol; skipped without them, except in CI
(.ci/run installs them)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def headless_chromium(download_dir: Path | None = None) -> Iterator:
    """A selenium driver of headless Chromium that keeps the browser log and the DevTools
    events (the ``performance`` log); files the page downloads land in ``download_dir``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (browser and driver_path):
        message = "headless Chromium needs the Debian packages chromium and chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(message + " (.ci/run installs them)")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,2400"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    if download_dir is not None:
        options.add_experimental_option("prefs", {"download.default_directory": str(download_dir),
                                                  "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def check_page(page: Path, screenshot: Path, timeout: float = 30.0) -> dict:
    """What the tests of a static page assert, read in headless Chromium once its charts are
    drawn or its images loaded: how many ``div.plot`` it has and how many hold a drawn chart,
    each image's natural width (0 unless it loaded), the browser's SEVERE log entries, and the
    body rows of each ``table.results``; a screenshot of the page lands in ``screenshot``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with headless_chromium() as driver:
        driver.get(page.as_uri())
        WebDriverWait(driver, timeout).until(lambda d: d.execute_script(
            "return [...document.querySelectorAll('div.plot')].every(p => p.querySelector('.main-svg'))"
            " || [...document.images].length > 0 && [...document.images].every(i => i.complete);"))
        plots, charts = driver.execute_script(
            "const plots = [...document.querySelectorAll('div.plot')];"
            "return [plots.length, plots.filter(p => p.querySelector('.main-svg')).length];")
        widths = [driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img)
                  for img in driver.find_elements(By.TAG_NAME, "img")]
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(screenshot))
        rows = [len(table.find_elements(By.CSS_SELECTOR, "tbody tr"))
                for table in driver.find_elements(By.CSS_SELECTOR, "table.results")]
    return {"plots": plots, "charts": charts, "image_widths": widths, "errors": errors, "table_rows": rows}


# --------------------------------------------------------------------------- the report's charts

BLOCKED = ["http://*", "https://*", "ws://*", "wss://*"]


@contextmanager
def offline_page(page: Path, timeout: float = 30.0) -> Iterator:
    """``page`` open in headless Chromium with the network off (offline and every http(s) and
    websocket URL blocked, through the DevTools protocol), once each ``div.plot`` holds a drawn
    Plotly chart; the driver."""
    from selenium.webdriver.support.ui import WebDriverWait

    with headless_chromium() as driver:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": BLOCKED})
        driver.execute_cdp_cmd("Network.emulateNetworkConditions",
                               {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
        driver.get(page.as_uri())
        WebDriverWait(driver, timeout).until(lambda d: d.execute_script(
            "const plots = document.querySelectorAll('div.plot');"
            "return plots.length > 0 && [...plots].every(p => p.querySelector('.main-svg'));"))
        yield driver


def requested_urls(driver) -> list[str]:
    """Every URL the page requested so far (DevTools ``Network.requestWillBeSent``)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def chart(driver, stem: str):
    """The ``div.plot`` of the figure ``stem``."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'div.plot[data-stem="{stem}"]')


def hover(driver, plot, x: float, y: float) -> list[str]:
    """Moves the mouse onto the data point (x, y) of a chart (a category axis counts its
    categories 0, 1, ...) and returns the lines of the tooltip (:func:`mouse_to`)."""
    px, py = driver.execute_script("""
        const [plot, x, y] = arguments;
        plot.scrollIntoView({block: "center"});
        const area = plot.querySelector(".nsewdrag").getBoundingClientRect();
        const [x0, x1] = plot.layout.xaxis.range, [y0, y1] = plot.layout.yaxis.range;
        return [area.left + (x - x0) / (x1 - x0) * area.width, area.bottom - (y - y0) / (y1 - y0) * area.height];
    """, plot, x, y)
    return mouse_to(driver, plot, px, py)


def hover_bar(driver, plot, name: str, index: int) -> list[str]:
    """Moves the mouse onto bar ``index`` of the bar trace ``name`` of a chart; the tooltip's lines."""
    px, py = driver.execute_script("""
        const [plot, name, index] = arguments;
        plot.scrollIntoView({block: "center"});
        const trace = plot.data.findIndex(t => t.name === name);
        const bar = plot.querySelectorAll(".barlayer .trace")[trace].querySelectorAll(".point")[index];
        const box = bar.getBoundingClientRect();
        return [box.left + box.width / 2, box.top + box.height / 2];
    """, plot, name, index)
    return mouse_to(driver, plot, px, py)


def mouse_to(driver, plot, px: float, py: float, timeout: float = 10.0) -> list[str]:
    """Moves the mouse to the viewport pixel (px, py) (a real mouse event, DevTools
    ``Input.dispatchMouseEvent``) and returns the lines of the chart's tooltip there."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.execute_cdp_cmd("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": px, "y": py})
    lines = WebDriverWait(driver, timeout).until(lambda d: d.execute_script(
        "const t = arguments[0].querySelector('.hoverlayer .hovertext');"
        "return t && [...t.querySelectorAll('text.nums tspan.line')].map(l => l.textContent);", plot))
    return [line.replace("\u2212", "-") for line in lines]


def tooltip_value(lines: list[str], label: str) -> tuple[float, float, int]:
    """(value, std, seeds) of a tooltip line ``<label> <value> ± <std> (std over <n> seeds)``."""
    line = next(ln for ln in lines if ln.startswith(label + " "))
    m = re.fullmatch(re.escape(label) + r" (\S+) ± (\S+) \(std over (\d+) (?:seeds|trials)\)", line)
    assert m, line
    return float(m[1]), float(m[2]), int(m[3])


def click_legend(driver, plot, name: str) -> None:
    """Clicks the legend entry ``name`` of a chart."""
    from selenium.webdriver.common.by import By

    entries = [e for e in plot.find_elements(By.CSS_SELECTOR, ".legend .traces")
               if e.find_element(By.CSS_SELECTOR, ".legendtext").text == name]
    assert len(entries) == 1, f"{len(entries)} legend entries named {name!r}"
    entries[0].click()


def traces(driver, plot) -> list[dict]:
    """Each trace of a chart as the page left it (``plot.data``, public): name, legend group,
    visible (true, false or ``legendonly``), opacity and line width (None where not set)."""
    return driver.execute_script(
        "return arguments[0].data.map(t => ({name: t.name, group: t.legendgroup, mode: t.mode,"
        " visible: t.visible === undefined ? true : t.visible, opacity: t.opacity === undefined ? 1 : t.opacity,"
        " width: t.line && t.line.width !== undefined ? t.line.width : null}));", plot)


def drawn_traces(driver, plot) -> int:
    """How many traces a chart draws (its SVG's ``g.trace`` elements; a hidden one has none)."""
    return driver.execute_script("return arguments[0].querySelectorAll('.plot g.trace').length;", plot)


def column(driver, table_id: str, header: str) -> list[str]:
    """The texts of a table's column ``header``, of its rows shown, top to bottom."""
    return driver.execute_script("""
        const [id, header] = arguments;
        const table = document.getElementById(id);
        const i = [...table.tHead.rows[0].cells].findIndex(th => th.textContent === header);
        return [...table.tBodies[0].rows].filter(r => !r.hidden).map(r => r.cells[i].textContent);
    """, table_id, header)


def assert_offline(driver, page: Path) -> None:
    """The page drew with nothing but files of its folder (and data: URIs, which Plotly draws
    heatmaps with): no request to any other URL, no error in the browser's log, plotly.min.js
    read from beside it."""
    urls = requested_urls(driver)
    assert all(u.startswith((page.parent.as_uri() + "/", "data:")) for u in urls), urls
    assert (page.parent / "plotly.min.js").as_uri() in urls, urls
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def assert_legend_toggles(driver, plot, name: str) -> None:
    """A click on the legend entry ``name`` hides every trace of its legend group (line and
    band: the chart draws fewer traces), the other configurations stay; a second click shows
    them again."""
    from selenium.webdriver.support.ui import WebDriverWait

    before, drawn = traces(driver, plot), drawn_traces(driver, plot)
    group = next(t["group"] for t in before if t["name"] == name)
    mine = [i for i, t in enumerate(before) if t["group"] == group]
    assert all(t["visible"] is True for t in before)
    click_legend(driver, plot, name)
    WebDriverWait(driver, 10).until(lambda d: all(traces(d, plot)[i]["visible"] == "legendonly" for i in mine))
    after = traces(driver, plot)
    assert all(t["visible"] is True for i, t in enumerate(after) if i not in mine)
    assert drawn_traces(driver, plot) == drawn - len(mine)
    click_legend(driver, plot, name)
    WebDriverWait(driver, 10).until(lambda d: all(t["visible"] is True for t in traces(d, plot)))
    assert drawn_traces(driver, plot) == drawn


def sort_by(driver, table_id: str, header: str) -> list[str]:
    """Clicks the header ``header`` of a table; its column's texts, top to bottom, after."""
    from selenium.webdriver.common.by import By

    th = next(th for th in driver.find_elements(By.CSS_SELECTOR, f"#{table_id} thead th") if th.text == header)
    th.click()
    return column(driver, table_id, header)


def filter_rows(driver, table_id: str, text: str) -> None:
    """Types ``text`` into the filter box of a results table (replacing what it held)."""
    from selenium.webdriver.common.by import By

    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.CSS_SELECTOR, f'input.filter[data-table="{table_id}"]')
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.BACKSPACE)  # typed, not cleared: clear() fires no input event
    box.send_keys(text)


def tick_row(driver, table_id: str, header: str, value: str) -> None:
    """Clicks the box of the first shown row of a table whose column ``header`` reads ``value``."""
    box = driver.execute_script("""
        const [id, header, value] = arguments;
        const table = document.getElementById(id);
        const i = [...table.tHead.rows[0].cells].findIndex(th => th.textContent === header);
        const row = [...table.tBodies[0].rows].find(r => !r.hidden && r.cells[i].textContent === value);
        return row.querySelector("input[type=checkbox]");
    """, table_id, header, value)
    box.click()


def assert_highlighted(driver, plot, name: str) -> None:
    """The traces named ``name`` (one configuration) drawn opaque, its lines wide; every other
    configuration's faded."""
    for trace in traces(driver, plot):
        mine = trace["name"] == name
        assert trace["opacity"] == (1 if mine else 0.2), trace
        if trace["mode"] == "lines":
            assert trace["width"] == (4 if mine else 2), trace


def assert_zoom_and_reset(driver, plot) -> None:
    """Dragging the mouse across the middle half of a chart's plot area zooms its x axis to
    about that span (real mouse events, DevTools ``Input.dispatchMouseEvent``); a double
    click resets it."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.support.ui import WebDriverWait

    full = list(driver.execute_script("return arguments[0].layout.xaxis.range.slice()", plot))
    left, right, y = driver.execute_script("""
        const plot = arguments[0];
        plot.scrollIntoView({block: "center"});
        const area = plot.querySelector(".nsewdrag").getBoundingClientRect();
        return [area.left + area.width / 4, area.left + 3 * area.width / 4, area.top + area.height / 2];
    """, plot)
    mouse = [("mousePressed", left, 1), ("mouseMoved", (left + right) / 2, 0), ("mouseMoved", right, 0),
             ("mouseReleased", right, 1)]
    for kind, x, clicks in mouse:
        driver.execute_cdp_cmd("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left",
                                                            "buttons": 1 if kind != "mouseReleased" else 0,
                                                            "clickCount": clicks})
    span = full[1] - full[0]
    zoomed = WebDriverWait(driver, 10).until(lambda d: (r := d.execute_script(
        "return arguments[0].layout.xaxis.range.slice()", plot)) != full and r)
    assert abs(zoomed[0] - (full[0] + span / 4)) < span / 20 and abs(zoomed[1] - (full[1] - span / 4)) < span / 20, \
        (full, zoomed)
    # Plotly takes two presses as a double click only within its doubleClickDelay (300 ms): first
    # that long after the drag's press (else one click made a double click with it), then both
    # clicks in one WebDriver command (four DevTools calls, one by one, overran it under load).
    time.sleep(2 * driver.execute_script("return arguments[0]._context.doubleClickDelay", plot) / 1000)
    actions = ActionBuilder(driver)
    actions.pointer_action.move_to_location(int(left), int(y)).double_click()
    actions.perform()
    WebDriverWait(driver, 10).until(lambda d: d.execute_script(
        "return arguments[0].layout.xaxis.range.slice()", plot) == full)
