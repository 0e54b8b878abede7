"""The dependency-free PNG scatter plot: a valid file whose pixels show the points where they
belong."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from knowledge.embodiment._plot import _H, _W, COLORS, Panel, scatter_png


def read_png(path) -> np.ndarray:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = {}, 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        assert struct.unpack(">I", data[at + 8 + length : at + 12 + length])[0] == zlib.crc32(
            kind + body
        )
        chunks[kind] = body
        at += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color) == (8, 2) and b"IEND" in chunks
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(height, 1 + 3 * width)
    assert (rows[:, 0] == 0).all()
    return rows[:, 1:].reshape(height, width, 3)


def test_panels_side_by_side_with_points_in_their_colours(tmp_path):
    x = np.array([0.0, 1.0, 2.0])
    y = np.array([1.0, 0.5, 0.0])
    path = tmp_path / "plot.png"
    scatter_png(
        path,
        [Panel("LEFT", x, y, np.zeros(3)), Panel("RIGHT", x, y, np.ones(3))],
        ["REACH", "WALK"],
    )
    image = read_png(path)
    assert image.shape == (_H, 2 * _W, 3)
    left, right = image[:, :_W].astype(int), image[:, _W:].astype(int)

    def tinted(panel: np.ndarray, color: tuple[int, int, int]) -> np.ndarray:
        """Pixels moved from white towards `color` by a translucent dot (not text, which is
        opaque)."""
        target = np.array(color)
        shift = 255 - panel
        return (shift.sum(-1) > 20) & (np.abs(panel - (255 + 0.35 * (target - 255))).max(-1) < 3)

    blue, orange = tinted(left, COLORS[0]), tinted(right, COLORS[1])
    assert blue.sum() >= 3 * 16 and orange.sum() >= 3 * 16 and not tinted(left, COLORS[1]).any()
    # the point at x = 0, y = 1 sits at the top left of the plot area, x = 2, y = 0 at the bottom
    # right
    rows, cols = np.nonzero(blue)
    assert (
        rows.min() < _H // 4
        and cols.min() < _W // 4
        and rows.max() > 3 * _H // 4
        and cols.max() > 3 * _W // 4
    )


def test_empty_panels_still_draw_axes(tmp_path):
    path = tmp_path / "empty.png"
    scatter_png(path, [Panel("NOTHING", np.zeros(0), np.zeros(0), np.zeros(0))])
    image = read_png(path)
    assert image.shape == (_H, _W, 3) and (image == 0).all(-1).sum() > _W  # black axes and text
