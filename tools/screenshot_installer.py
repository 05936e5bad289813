"""Screenshots of the Windows installer's pages, taken on Linux: the installer runs under wine on a virtual X
screen (Xvfb), Enter moves it page by page, and each page is saved cropped to the window.

Without an NVIDIA driver (as under wine) the pages are: welcome, the no-driver page, components, and the progress
page, which stops at the Python download (uv.exe does not run under wine 8, and no download site is reachable
offline) with the Retry/Cancel box.

    python3 tools/screenshot_installer.py dist/HoneStudio-Setup-0.1.0.exe docs/screenshots
Needs Debian's wine64, xvfb and xdotool, and Pillow built with XCB (PyPI's wheels are).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import ImageGrab

DISPLAY = ":73"
PAGES = ("welcome", "no-driver", "components", "progress")
SETTLE_S = 5.0  # long enough for a page (and wine's first window) to draw on two cores


def wine64() -> str:
    for candidate in ("/usr/lib/wine/wine64", shutil.which("wine64"), shutil.which("wine")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    sys.exit("wine64 is not installed (Debian: apt install wine wine64)")


def grab(path: Path) -> None:
    screen = ImageGrab.grab(xdisplay=DISPLAY)
    screen.crop(screen.getbbox()).save(path)  # the screen is black around the one window
    print(f"saved {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("installer", type=Path)
    parser.add_argument("out", type=Path, help="folder for installer-<page>.png")
    args = parser.parse_args()
    for tool in ("Xvfb", "xdotool"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (Debian: apt install xvfb xdotool)")
    wine = wine64()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hone-installer-shots-") as scratch:
        env = {
            **os.environ,
            "DISPLAY": DISPLAY,
            "WINEPREFIX": f"{scratch}/prefix",
            "WINEDEBUG": "-all",
            "WINEDLLOVERRIDES": "mscoree,mshtml=",
        }  # no Mono or Gecko prompts in a fresh prefix
        screen = subprocess.Popen(["Xvfb", DISPLAY, "-screen", "0", "1024x768x24"], stderr=subprocess.DEVNULL)
        installer = None
        try:
            subprocess.run([wine, "wineboot", "-i"], env=env, capture_output=True, check=True, timeout=300)
            installer = subprocess.Popen(
                [wine, str(args.installer.resolve())], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            for index, page in enumerate(PAGES):
                time.sleep(SETTLE_S if index else 2 * SETTLE_S)
                grab(args.out / f"installer-{page}.png")
                subprocess.run(["xdotool", "key", "Return"], env=env, check=True)
        finally:
            if installer is not None:
                installer.kill()
            subprocess.run([str(Path(wine).with_name("wineserver")), "-k"], env=env, capture_output=True)
            screen.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
