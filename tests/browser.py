"""A real browser for tests: headless Chromium driven by Selenium, and a page served on 127.0.0.1.

Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them where missing); Selenium is told where both
are, so it never tries to download a driver. Without them the test is skipped — a failure under ``CI=true``
(tests/conftest.py), where every part must be present.
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn

from fedgl_secure.services.loopback import free_ports
from fedgl_secure.services.tls import run_server_in_thread

WIDTH = 1280


@contextmanager
def headless_chromium() -> Iterator:
    """A Selenium driver of headless Chromium; skips when the browser or its driver is missing or cannot start."""
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if browser is None or driver_path is None:
        pytest.skip("headless Chromium needs Debian's chromium and chromium-driver (apt-get install ...)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)  # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
    options.add_argument(f"--window-size={WIDTH},1000")
    try:
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
    except WebDriverException as error:
        pytest.skip(f"headless Chromium did not start: {error.msg}")
    try:
        yield driver
    finally:
        driver.quit()


def full_page_screenshot(driver, path: Path) -> None:
    """The whole page as PNG, beyond the window (Chrome DevTools' capture: Selenium's own shows the window only)."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


@contextmanager
def served(app) -> Iterator[str]:
    """``app`` served over HTTP on a free port of 127.0.0.1 for the ``with`` block; yields its URL."""
    port = free_ports(1)[0]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    with run_server_in_thread(server):
        yield f"http://127.0.0.1:{port}"
