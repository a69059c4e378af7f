"""Headless Chromium for the playground tests: Debian's `chromium` driven by its own
`chromedriver` through Selenium, both named by path so that Selenium Manager never runs (it
would download a browser or a driver)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def chromium_driver(width: int = 1280, height: int = 800):
    """A headless Chromium session that keeps the browser's console log; skips with the
    reason where the Debian packages are missing."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.is_file()]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} missing: `make test` installs Debian's chromium and "
            "chromium-driver (apt-get, needs root); they could not be installed here"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--disable-extensions",
                "--no-first-run", "--disable-background-networking"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # chromedriver writes its own log; keep it out of the test's output
    service = Service(executable_path=str(CHROMEDRIVER), log_output=os.devnull)
    return webdriver.Chrome(options=options, service=service)
