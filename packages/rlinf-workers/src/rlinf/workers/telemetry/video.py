"""Evaluation videos from rendered frames: GIF through Pillow, MP4 through imageio-ffmpeg."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlinf.workers._extras import require
from rlinf.workers.errors import ConfigError, ShapeError

__all__ = ["write_video"]


def _check_frames(frames: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    """Stack `frames` into a (T, H, W, C) uint8 array, C in {1, 3, 4}, or raise."""
    if len(frames) == 0:
        raise ShapeError("write_video got no frames; pass at least one (H, W, 3) uint8 frame")
    shapes = {np.shape(f) for f in frames}
    if len(shapes) > 1:
        raise ShapeError(f"write_video frames differ in shape ({sorted(shapes)}); every frame "
                         "must have the same (H, W, C) shape")
    stack = np.asarray(frames)
    if stack.dtype != np.uint8:
        raise ShapeError(f"write_video frames have dtype {stack.dtype}; expected uint8 in "
                         "[0, 255] (convert floats with (x * 255).clip(0, 255).astype(np.uint8))")
    if stack.ndim == 3:  # (T, H, W) grayscale
        stack = stack[..., None]
    if stack.ndim != 4 or stack.shape[-1] not in (1, 3, 4):
        raise ShapeError(f"write_video frames have shape {stack.shape[1:]}; expected (H, W), "
                         "(H, W, 1), (H, W, 3) or (H, W, 4)")
    if stack.shape[1] == 0 or stack.shape[2] == 0:
        raise ShapeError(f"write_video frames are empty images of shape {stack.shape[1:]}")
    return stack


def _write_gif(stack: np.ndarray, path: Path, fps: int) -> None:
    image = require("PIL.Image", feature="GIF video", extra="telemetry")
    gray = stack.shape[-1] == 1
    pictures = [image.fromarray(np.ascontiguousarray(f[..., 0] if gray else f)) for f in stack]
    pictures[0].save(path, format="GIF", save_all=True, append_images=pictures[1:],
                     duration=max(1, round(1000 / fps)), loop=0, optimize=False)


def _write_mp4(stack: np.ndarray, path: Path, fps: int) -> None:
    feature = "writing .mp4 video (or write a .gif, which needs only Pillow)"
    require("imageio_ffmpeg", feature=feature, extra="video")
    imageio: Any = require("imageio.v2", feature=feature, extra="video")
    if stack.shape[-1] == 1:
        stack = np.repeat(stack, 3, axis=-1)
    elif stack.shape[-1] == 4:
        stack = stack[..., :3]
    # yuv420p (the widely playable pixel format) needs even sides; pad by one pixel if odd
    pad_h, pad_w = stack.shape[1] % 2, stack.shape[2] % 2
    if pad_h or pad_w:
        stack = np.pad(stack, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    with imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264",
                            pixelformat="yuv420p", macro_block_size=1) as writer:
        for frame in stack:
            writer.append_data(frame)


def write_video(frames: Sequence[np.ndarray] | np.ndarray, path: Path, *, fps: int = 30) -> Path:
    """Write uint8 frames, each (H, W), (H, W, 3) or (H, W, 4), as a video; returns `path`.

    The suffix picks the format: ``.gif`` (Pillow, the `telemetry` extra) always works;
    ``.mp4`` needs imageio and imageio-ffmpeg. GIF frame delays are whole milliseconds,
    so fps above 100 is not kept exactly by most players.
    """
    path = Path(path)
    if isinstance(fps, bool) or not isinstance(fps, int) or fps <= 0:
        raise ConfigError(f"write_video fps={fps!r}: expected a positive int")
    suffix = path.suffix.lower()
    if suffix not in (".gif", ".mp4"):
        raise ConfigError(f"write_video cannot write {path.name!r}: use a .gif or .mp4 path")
    stack = _check_frames(frames)
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".gif":
        _write_gif(stack, path, fps)
    else:
        _write_mp4(stack, path, fps)
    return path
