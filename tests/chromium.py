"""Headless Chromium for the tests of HTML pages: Debian's chromium and chromium-driver
(``make browser``), driven by selenium; skipped without them, except in CI (.ci/run installs
them)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def headless_chromium(download_dir: Path | None = None) -> Iterator:
    """A selenium driver of headless Chromium that keeps the browser log; files the page
    downloads land in ``download_dir``."""
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
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if download_dir is not None:
        options.add_experimental_option("prefs", {"download.default_directory": str(download_dir),
                                                  "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def check_page(page: Path, screenshot: Path) -> dict:
    """What the tests of a static page assert, read in headless Chromium: each image's natural
    width (0 unless it loaded), the browser's SEVERE log entries, and the body rows of each
    ``table.results``; a screenshot of the page lands in ``screenshot``."""
    from selenium.webdriver.common.by import By

    with headless_chromium() as driver:
        driver.get(page.as_uri())
        widths = [driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img)
                  for img in driver.find_elements(By.TAG_NAME, "img")]
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(screenshot))
        rows = [len(table.find_elements(By.CSS_SELECTOR, "tbody tr"))
                for table in driver.find_elements(By.CSS_SELECTOR, "table.results")]
    return {"image_widths": widths, "errors": errors, "table_rows": rows}
