"""A dependency-free scatter plot written as PNG (numpy and zlib): enough for the encoder report.

Panels side by side, each with axes, five labelled ticks per axis, a title and dots coloured by
group. Text uses a 3x5 pixel font (upper case, digits, a little punctuation) drawn at twice its
size.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# each glyph is five rows of three pixels, one octal digit per row (4 = left pixel, 1 = right pixel)
_FONT = dict(
    zip(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:=()/,+<>_ ",
        "25755 65656 34443 65556 74647 74644 34553 "
        "55755 72227 11152 55655 44447 57755 65555 "
        "25552 65644 25563 65655 34216 72222 55557 "
        "55552 55775 55255 55222 71247 75557 26227 "
        "61247 61216 55711 74616 34757 71222 75757 "
        "75716 00002 00700 02020 07070 12221 42224 "
        "11244 00024 02720 12421 42124 00007 00000".split(),
        strict=True,
    )
)
COLORS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189))
_W, _H, _LEFT, _RIGHT, _TOP, _BOTTOM = 440, 380, 58, 16, 40, 44
_SCALE = 2


@dataclass(frozen=True)
class Panel:
    """One scatter plot: points (x[i], y[i]) coloured by `group[i]` (an index into COLORS)."""

    title: str
    x: np.ndarray
    y: np.ndarray
    group: np.ndarray


def _text(
    canvas: np.ndarray, x: int, y: int, text: str, color: tuple[int, int, int] = (0, 0, 0)
) -> None:
    """Draw `text` with its top-left corner at (x, y); characters the font lacks are left blank."""
    for k, char in enumerate(text.upper()):
        rows = _FONT.get(char, "00000")
        for r, digit in enumerate(rows):
            for c in range(3):
                if int(digit, 8) & (4 >> c):
                    top, left = y + r * _SCALE, x + (4 * k + c) * _SCALE
                    canvas[top : top + _SCALE, left : left + _SCALE] = color


def _width(text: str) -> int:
    return (4 * len(text) - 1) * _SCALE


def _ticks(low: float, high: float) -> np.ndarray:
    return np.linspace(low, high, 5)


def _label(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.0f}"


def _panel(panel: Panel, legend: Sequence[str]) -> np.ndarray:
    canvas = np.full((_H, _W, 3), 255.0)
    x0, x1, y0, y1 = _LEFT, _W - _RIGHT, _H - _BOTTOM, _TOP  # plot area (y grows downwards)
    xs = np.asarray(panel.x, float)
    xmax = float(xs.max()) if len(xs) and xs.max() > 0 else 1.0
    for value in _ticks(0.0, xmax):
        px = int(round(x0 + value / xmax * (x1 - x0)))
        canvas[y1:y0, px] = 225
        _text(canvas, px - _width(_label(value)) // 2, y0 + 6, _label(value))
    for value in _ticks(0.0, 1.0):
        py = int(round(y0 - value * (y0 - y1)))
        canvas[py, x0:x1] = 225
        _text(canvas, x0 - 6 - _width(_label(value)), py - 5, _label(value))
    canvas[y1 : y0 + 1, x0] = 0
    canvas[y0, x0 : x1 + 1] = 0
    _text(canvas, (x0 + x1 - _width("DISTANCE")) // 2, _H - 16, "DISTANCE")
    _text(canvas, 6, 8, panel.title)
    _text(canvas, 6, 24, "SUCCESS")
    for k, name in enumerate(legend):
        _text(canvas, x1 - _width(name) - 4, y1 + 4 + 14 * k, name, COLORS[k % len(COLORS)])
    jitter = np.random.default_rng(0).uniform(
        -0.008, 0.008, len(xs)
    )  # spreads equal success rates a little
    for x, y, g, j in zip(xs, panel.y, panel.group, jitter, strict=True):
        cx, cy = x0 + x / xmax * (x1 - x0), y0 - min(max(y + j, 0.0), 1.0) * (y0 - y1)
        top, left = int(cy) - 2, int(cx) - 2
        patch = canvas[max(top, 0) : top + 5, max(left, 0) : left + 5]
        patch += 0.35 * (
            np.array(COLORS[int(g) % len(COLORS)]) - patch
        )  # translucent dots show density
    return canvas


def scatter_png(
    path: str | os.PathLike[str], panels: Sequence[Panel], legend: Sequence[str] = ()
) -> None:
    """Write the panels side by side as an RGB PNG."""
    image = (
        np.concatenate([_panel(p, legend) for p in panels], axis=1)
        .round()
        .clip(0, 255)
        .astype(np.uint8)
    )
    height, width = image.shape[:2]
    raw = b"".join(
        b"\x00" + image[row].tobytes() for row in range(height)
    )  # filter type 0 on every row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    Path(path).write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
