from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageSequence

from rlinf.workers.errors import ConfigError, MissingExtraError, ShapeError
from rlinf.workers.telemetry import write_video


def _frames(n: int = 5, h: int = 16, w: int = 24) -> np.ndarray:
    frames = np.zeros((n, h, w, 3), dtype=np.uint8)
    for i in range(n):
        frames[i, :, : (i + 1) * w // n, 0] = 255  # a red bar that grows
    return frames


def test_gif_round_trips_frames_and_timing(tmp_path: Path) -> None:
    path = write_video(list(_frames()), tmp_path / "v.gif", fps=10)
    with Image.open(path) as im:
        got = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(im)]
        assert im.info["duration"] == 100
    assert len(got) == 5 and got[0].shape == (16, 24, 3)
    assert np.array_equal(got[2], _frames()[2])


def test_grayscale_and_rgba_frames(tmp_path: Path) -> None:
    gray = np.arange(3, dtype=np.uint8)[:, None, None] * np.full((3, 8, 8), 60, dtype=np.uint8)
    write_video(gray, tmp_path / "g.gif")
    write_video(gray[..., None], tmp_path / "g1.gif")
    rgba = np.repeat(gray[..., None], 4, axis=-1)
    write_video(rgba, tmp_path / "a.gif")
    for name in ("g.gif", "g1.gif", "a.gif"):
        with Image.open(tmp_path / name) as im:
            assert getattr(im, "n_frames", 1) == 3
            im.seek(2)
            assert np.asarray(im.convert("L"))[0, 0] == 120


@pytest.mark.parametrize(("frames", "match"), [
    ([], "no frames"),
    (np.zeros((2, 8, 8, 3), dtype=np.float32), "uint8"),
    (np.zeros((2, 8, 8, 2), dtype=np.uint8), "expected"),
    ([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 9, 3), np.uint8)], "differ in shape"),
])
def test_bad_frames_are_shape_errors(tmp_path: Path, frames: object, match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        write_video(frames, tmp_path / "x.gif")  # type: ignore[arg-type]
    assert not (tmp_path / "x.gif").exists()


def test_bad_suffix_or_fps_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\.gif or \.mp4"):
        write_video(_frames(), tmp_path / "x.avi")
    with pytest.raises(ConfigError, match="fps"):
        write_video(_frames(), tmp_path / "x.gif", fps=0)


_HAS_FFMPEG = importlib.util.find_spec("imageio_ffmpeg") is not None


@pytest.mark.skipif(_HAS_FFMPEG, reason="imageio-ffmpeg is installed")
def test_mp4_without_ffmpeg_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(MissingExtraError, match=r"\.gif") as info:
        write_video(_frames(), tmp_path / "x.mp4")
    assert "imageio_ffmpeg" in str(info.value)


@pytest.mark.skipif(not _HAS_FFMPEG, reason="needs imageio-ffmpeg")
def test_mp4_is_written(tmp_path: Path) -> None:
    import imageio.v2 as imageio

    path = write_video(_frames(h=15, w=23), tmp_path / "x.mp4", fps=5)
    frames = [np.asarray(f) for f in imageio.get_reader(path)]  # type: ignore[attr-defined]
    assert len(frames) == 5 and frames[0].shape == (16, 24, 3)
