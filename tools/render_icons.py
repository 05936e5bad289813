#!/usr/bin/env python3
"""Render Hone's logo (resources/icons/logo.svg) into the raster icons the platforms want.

Writes resources/icons/hone.png (256 px, for Linux desktops and the window icon) and resources/icons/hone.ico
(16 to 256 px, for the Windows installer and shortcuts). Both are committed; run this again after changing
logo.svg. Needs PySide6 (QtSvg) and Pillow; runs without a display.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from pathlib import Path

ICONS = Path(__file__).resolve().parents[1] / "resources" / "icons"
PNG_SIZE = 256
# The sizes Windows asks an .ico for: 16/24/32 in lists and the taskbar, 48 and 64 in Explorer's views, 128/256 large
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)


def render_png(svg: Path, size: int) -> bytes:
    """The SVG drawn on a transparent square of `size` pixels, as PNG bytes."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication([])  # QPainter on a QImage needs one, off screen is enough
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg}: Qt cannot read this SVG; check that it is well-formed")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(0)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    buffer.close()
    return bytes(data)


def write_icons(svg: Path, out: Path) -> list[Path]:
    """Write hone.png and hone.ico into `out`; every .ico size is drawn from the SVG, not scaled from 256 px."""
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    png = out / "hone.png"
    png.write_bytes(render_png(svg, PNG_SIZE))
    frames = [Image.open(io.BytesIO(render_png(svg, size))) for size in ICO_SIZES]
    ico = out / "hone.ico"
    # Pillow writes the first image's size plus every `sizes` entry it can take from `append_images`
    frames[-1].save(ico, format="ICO", sizes=[(s, s) for s in ICO_SIZES], append_images=frames[:-1])
    return [png, ico]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--svg", type=Path, default=ICONS / "logo.svg", help="the logo to render (default: %(default)s)"
    )
    parser.add_argument(
        "--out", type=Path, default=ICONS, help="folder for hone.png and hone.ico (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    for path in write_icons(args.svg, args.out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
