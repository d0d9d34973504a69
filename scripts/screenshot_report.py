"""Render a `qtool report` page in headless Chromium and save a PNG screenshot.

    python scripts/screenshot_report.py report.html report.png [--sort sqnr] [--size 1400x3000]

Needs a Chromium binary (Debian: apt-get install chromium); none of qtool needs it. The page is
opened from the file system with networking disabled by a proxy that goes nowhere, so the
screenshot also shows the page needs nothing from the network. --sort opens it with
#sort=KEY (order, amax, clipped, tsqnr, sqnr), which runs the page's own sorting script first.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_args(browser: str, url: str, profile: str) -> list[str]:
    return [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",  # no network
        f"--user-data-dir={profile}", "--virtual-time-budget=5000", url,
    ]


def screenshot(html: Path, png: Path, sort: str | None = None, size: str = "1400x2400", browser: str | None = None) -> None:
    browser = browser or find_browser()
    if browser is None:
        raise SystemExit("no Chromium found (apt-get install chromium)")
    url = html.resolve().as_uri() + (f"#sort={sort}" if sort else "")
    w, h = size.lower().split("x")
    with tempfile.TemporaryDirectory() as profile:
        args = chromium_args(browser, url, profile)
        args[-1:-1] = [f"--screenshot={png.resolve()}", f"--window-size={int(w)},{int(h)}"]
        subprocess.run(args, check=True, capture_output=True, timeout=120)
    if not png.exists():
        raise SystemExit(f"Chromium wrote no screenshot to {png}")


def dump_dom(html: Path, sort: str | None = None, browser: str | None = None) -> str:
    """The page's DOM after its scripts ran (what a browser shows), as HTML text."""
    browser = browser or find_browser()
    if browser is None:
        raise SystemExit("no Chromium found (apt-get install chromium)")
    url = html.resolve().as_uri() + (f"#sort={sort}" if sort else "")
    with tempfile.TemporaryDirectory() as profile:
        args = chromium_args(browser, url, profile)
        args.insert(-1, "--dump-dom")
        return subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--sort", choices=["order", "amax", "clipped", "tsqnr", "sqnr"])
    ap.add_argument("--size", default="1400x2400", help="window WxH in pixels")
    a = ap.parse_args(argv)
    screenshot(a.html, a.png, a.sort, a.size)
    print(f"{a.html} -> {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
