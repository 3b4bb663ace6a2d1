"""rlinf.comm.shm: the public names other packages use (details in _internal/test_shm.py)."""

from __future__ import annotations

from rlinf.comm import shm
from rlinf.comm._internal import shm as internal_shm


def test_public_names_are_the_implementation() -> None:
    for name in shm.__all__:
        assert getattr(shm, name) is getattr(internal_shm, name), name


def test_pool_lends_and_reader_maps() -> None:
    pool, reader = shm.SegmentPool(max_free_bytes=0), shm.SegmentReader()
    try:
        segment = pool.acquire(16)
        segment.view[:5] = b"hello"
        released = []
        view = reader.open_view(segment.name, 0, 5, on_release=lambda: released.append(1))
        assert bytes(view) == b"hello"
        del view
        assert released == [1]
        pool.release(segment.name)
    finally:
        reader.close()
        pool.close()
