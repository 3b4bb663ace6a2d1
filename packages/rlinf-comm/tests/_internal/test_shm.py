"""Tests of rlinf.comm._internal.shm: permissions, names, pool reuse, release, no leaks."""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from rlinf.comm._internal import codec, shm
from rlinf.comm.errors import TransportError

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm (Linux)")


@pytest.fixture
def pool():
    p = shm.SegmentPool(max_free_bytes=8 << 20)
    yield p
    p.close()


def _wait_until(predicate, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def test_segments_are_private_and_unguessable(pool):
    seg = pool.acquire(1000)
    info = os.stat(SHM / seg.name)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.getuid()
    assert re.fullmatch(r"rlinf-[0-9a-f]{32}", seg.name)
    names = {shm.new_segment_name() for _ in range(2000)}
    assert len(names) == 2000


def test_creation_is_exclusive(pool):
    seg = pool.acquire(10)
    with pytest.raises(FileExistsError):
        shm.Segment(4096, name=seg.name)
    assert (SHM / seg.name).exists()  # the failed attempt did not remove the original


def test_pool_reuses_segments_by_size_class(pool):
    first = pool.acquire(3 << 20)
    assert first.size == 4 << 20
    pool.release(first.name)
    again = pool.acquire(4 << 20)
    assert again is first  # same segment, same warm pages
    other = pool.acquire(100)  # a different size class: a new segment
    assert other is not first and other.size == 1 << 20
    assert pool.created == 2
    with pytest.raises(TransportError, match="lent by this pool"):
        pool.release("rlinf-" + "0" * 32)


def test_pool_trims_free_segments_beyond_its_budget(pool):
    segs = [pool.acquire(4 << 20) for _ in range(3)]  # 12 MiB, budget 8 MiB free
    for s in segs:
        pool.release(s.name)
    assert pool.free_bytes == 8 << 20
    assert not (SHM / segs[0].name).exists()  # the oldest went
    assert all((SHM / s.name).exists() for s in segs[1:])


def test_close_unlinks_everything(pool):
    busy = pool.acquire(10)
    free = pool.acquire(2 << 20)
    pool.release(free.name)
    pool.close()
    assert not (SHM / busy.name).exists()
    assert not (SHM / free.name).exists()
    with pytest.raises(TransportError):
        pool.acquire(10)


def test_reader_views_without_copy_and_release_fires_when_views_die(pool):
    seg = pool.acquire(1 << 16)
    src = np.arange(1000, dtype=np.float32)
    n = codec.encode_into({"x": src}, seg.view)
    reader = shm.SegmentReader()
    fired: list[int] = []
    view = reader.open_view(seg.name, 0, n, on_release=lambda: fired.append(1))
    batch = codec.decode(view)
    del view
    x = batch["x"]
    del batch
    gc.collect()
    assert fired == []  # x still references the segment
    assert np.array_equal(x, src)
    # Zero-copy: the creator's writes show through the reader's array.
    np.frombuffer(seg.view, dtype=np.uint8)  # the creator's mapping stays usable
    x_addr = x.ctypes.data
    owner = np.frombuffer(seg.view, dtype=np.uint8)
    offset = x_addr - owner.ctypes.data
    assert offset < 0 or offset >= seg.size  # a distinct mapping of the same pages ...
    owner[:n] = np.frombuffer(codec.encode({"x": src * 2}), dtype=np.uint8)
    assert np.array_equal(x, src * 2)  # ... that sees the same bytes
    del x, owner
    assert fired == [1]
    # The mapping is cached: a second message on the same segment maps nothing new.
    before = dict(reader._maps)
    reader.open_view(seg.name, 0, n)
    assert reader._maps == before
    reader.close()


@pytest.mark.parametrize("consumer", ["numpy", "numpy-slice", "pyarrow", "torch"])
def test_release_waits_for_every_buffer_built_on_the_view(pool, consumer):
    """Regression: `np.frombuffer(view)` re-exports from the mapping and drops `view`; the
    release must still wait for the arrays, or the owner reuses the segment under them."""
    seg = pool.acquire(4096)
    reader = shm.SegmentReader()
    fired: list[int] = []
    view = reader.open_view(seg.name, 0, 800, on_release=lambda: fired.append(1))
    if consumer == "numpy":
        held = np.frombuffer(view, dtype=np.int64, count=50, offset=400).reshape(5, 10)
    elif consumer == "numpy-slice":
        held = np.frombuffer(view[8:], dtype=np.int64)
    elif consumer == "pyarrow":
        pa = pytest.importorskip("pyarrow")
        held = pa.py_buffer(view)
    else:
        torch = pytest.importorskip("torch")
        held = torch.frombuffer(view, dtype=torch.uint8)
    del view
    gc.collect()
    assert fired == [], f"released while a {consumer} buffer still uses the segment"
    del held
    gc.collect()
    assert fired == [1]
    reader.close()


def test_reader_refuses_foreign_names_and_bad_ranges(pool):
    reader = shm.SegmentReader()
    for bad in ["../etc/passwd", "psm_123", "rlinf-XYZ", "rlinf-" + "a" * 10]:
        with pytest.raises(TransportError, match="segment name"):
            reader.open_view(bad, 0, 1)
    with pytest.raises(TransportError, match="gone"):
        reader.open_view("rlinf-" + "0" * 32, 0, 1)
    seg = pool.acquire(10)
    with pytest.raises(TransportError, match="inside segment"):
        reader.open_view(seg.name, seg.size - 4, 8)
    reader.close()


def test_reader_drops_mappings_of_unlinked_segments(pool):
    reader = shm.SegmentReader()
    old = pool.acquire(10)
    reader.open_view(old.name, 0, 10)
    pool.release(old.name)
    pool.close()  # unlinks `old`
    fresh = shm.SegmentPool()
    try:
        reader.open_view(fresh.acquire(10).name, 0, 10)
        assert old.name not in reader._maps
    finally:
        fresh.close()
        reader.close()


_CREATOR = textwrap.dedent("""
    import json, os, signal, sys
    from rlinf.comm._internal import shm
    pool = shm.default_pool()
    a = pool.acquire(1 << 20)
    b = pool.acquire(3 << 20)
    a.view[:5] = b"hello"
    pool.release(b.name)  # one busy, one free: both must go
    info = {"names": [a.name, b.name], "guardian": shm._guardian.pid}
    print("INFO", json.dumps(info), flush=True)
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.readline()  # exit cleanly when told to
""")


def _start_creator(mode: str) -> tuple[subprocess.Popen[str], dict]:
    proc = subprocess.Popen([sys.executable, "-c", _CREATOR, mode], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # structlog's default output shares stdout
        if line.startswith("INFO "):
            return proc, json.loads(line[5:])
    raise AssertionError(f"creator exited early with {proc.wait(timeout=30)}")


def test_the_guardian_is_detached_from_its_creator():
    """A supervisor that SIGKILLs a dying process's children (Ray kills a killed actor's)
    must not take the guardian with it: the guardian is not the creator's child."""
    proc, info = _start_creator("clean")
    try:
        assert psutil.Process(info["guardian"]).ppid() != proc.pid
        assert info["guardian"] not in {c.pid for c in psutil.Process(proc.pid).children()}
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=30)


def test_a_creator_killed_while_starting_its_guardian_leaves_it_quiet():
    """A creator SIGKILLed before it read its guardian's pid (the soak's producers are, at
    random) closes the pipe the guardian writes its pid to: the guardian has nothing to
    guard yet and exits at once, without a traceback."""
    script = Path(shm.__file__).with_name("guardian.py")
    proc = subprocess.Popen([sys.executable, "-I", str(script)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the creator is gone before the guardian writes its pid
    proc.stdin.close()
    errors = proc.stderr.read()  # EOF once the detached guardian, which shares it, exits
    proc.wait(timeout=30)
    assert errors == b"", errors.decode()


def test_sigkilled_creator_leaves_no_segment_behind():
    proc, info = _start_creator("kill")
    assert proc.wait(timeout=30) == -signal.SIGKILL
    guardian = psutil.Process(info["guardian"]) if psutil.pid_exists(info["guardian"]) else None
    if guardian is not None:
        psutil.wait_procs([guardian], timeout=30)
    _wait_until(lambda: not any((SHM / n).exists() for n in info["names"]), timeout=30,
                what="the guardian to unlink the dead creator's segments")


def test_clean_exit_unlinks_and_a_reader_process_never_unlinks():
    proc, info = _start_creator("clean")
    name = info["names"][0]
    # A separate reader process maps the segment and exits: the segment must survive
    # (multiprocessing's resource tracker would have unlinked it here).
    reader = subprocess.run(
        [sys.executable, "-c",
         "import sys; from rlinf.comm._internal import shm;"
         "print(bytes(shm.default_reader().open_view(sys.argv[1], 0, 5)).decode())", name],
        capture_output=True, text=True, timeout=60, check=True)
    assert reader.stdout.strip() == "hello"
    assert (SHM / name).exists()
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0
    # atexit unlinked both before the process ended.
    assert not any((SHM / n).exists() for n in info["names"])


def test_forked_child_never_unlinks_its_parents_segments(pool):
    seg = pool.acquire(10)
    parent_default = shm.default_pool()
    pid = os.fork()
    if pid == 0:  # child: run the exit hook, check the default pool is its own
        ok = False
        try:
            shm._close_at_exit()
            ok = shm.default_pool() is not parent_default
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (SHM / seg.name).exists()


def test_concurrent_opens_survive_evictions(pool):
    """Threads opening views while others evict mappings never see a closed mapping."""
    from concurrent.futures import ThreadPoolExecutor

    segs = [pool.acquire(4096) for _ in range(6)]
    for i, seg in enumerate(segs):
        seg.view[:1] = bytes([i])
    reader = shm.SegmentReader(max_mappings=2)  # every new name evicts another

    def hammer(start: int) -> int:
        total = 0
        for k in range(300):
            i = (start + k * 7) % len(segs)
            view = reader.open_view(segs[i].name, 0, 1)
            total += view[0] == i
            del view
        return total

    with ThreadPoolExecutor(4) as threads:
        assert sum(threads.map(hammer, range(4))) == 1200
    reader.close()


def test_a_killed_guardian_is_replaced_and_learns_the_live_names():
    script = textwrap.dedent("""
        import json, os, signal, sys
        import psutil
        from rlinf.comm._internal import shm
        pool = shm.default_pool()
        first = pool.acquire(10)
        old = shm._guardian.pid
        guardian = psutil.Process(old)  # detached: not our child, so no waitpid
        os.kill(old, signal.SIGKILL)
        psutil.wait_procs([guardian], timeout=30)
        second = pool.acquire(2 << 20)  # the write hits a dead pipe: a new guardian
        info = {"names": [first.name, second.name], "old": old, "new": shm._guardian.pid}
        print("INFO", json.dumps(info), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=False, timeout=60).stdout
    info = json.loads(next(x for x in out.splitlines() if x.startswith("INFO "))[5:])
    assert info["new"] not in (None, info["old"])
    if psutil.pid_exists(info["new"]):
        psutil.wait_procs([psutil.Process(info["new"])], timeout=30)
    _wait_until(lambda: not any((SHM / n).exists() for n in info["names"]), timeout=30,
                what="the replacement guardian to unlink both segments")


def test_sigkilled_reader_leaves_the_segment_to_its_creator(pool):
    seg = pool.acquire(10)
    seg.view[:2] = b"ok"
    script = ("import os, signal, sys; from rlinf.comm._internal import shm;"
              "v = shm.default_reader().open_view(sys.argv[1], 0, 2);"
              "print('READ', bytes(v).decode(), flush=True); os.kill(os.getpid(), 9)")
    out = subprocess.run([sys.executable, "-c", script, seg.name], capture_output=True, check=False,
                         text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL
    assert "READ ok" in out.stdout
    assert (SHM / seg.name).exists()  # the reader owned nothing, removed nothing
    pool.close()
    assert not (SHM / seg.name).exists()  # and the creator still cleans up


def test_a_killed_guardian_is_replaced_at_once_so_killing_its_creator_next_leaks_nothing():
    """Defect 6: guardian SIGKILLed, then its creator (which allocated nothing since): every
    segment is still unlinked, because the creator replaced its guardian when the pipe
    broke, not at its next allocation."""
    script = textwrap.dedent("""
        import json, os, signal, time
        import psutil
        from rlinf.comm._internal import shm
        pool = shm.default_pool()
        held = [pool.acquire(4096) for _ in range(50)]
        old = shm._guardian.pid
        os.kill(old, signal.SIGKILL)
        psutil.wait_procs([psutil.Process(old)], timeout=30)
        deadline = time.monotonic() + 10
        while shm._guardian.pid in (None, old) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # the replacement reads the live names from its pipe
        info = {"names": [s.name for s in held], "old": old, "new": shm._guardian.pid}
        print("INFO", json.dumps(info), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=False, timeout=60).stdout
    info = json.loads(next(x for x in out.splitlines() if x.startswith("INFO "))[5:])
    assert info["new"] not in (None, info["old"]), "the guardian was not replaced"
    if psutil.pid_exists(info["new"]):
        psutil.wait_procs([psutil.Process(info["new"])], timeout=30)
    _wait_until(lambda: not any((SHM / n).exists() for n in info["names"]), timeout=30,
                what="the replacement guardian to unlink all 50 segments")


def test_a_segment_dropped_without_unlink_takes_its_name_along():
    # A ring or pool dropped unclosed in a long-lived process must not leave an unmapped
    # name behind until the process exits (a test suite's process ran for minutes so).
    seg = shm.Segment(1 << 20)
    name = seg.name
    assert (SHM / name).exists()
    del seg
    gc.collect()
    assert not (SHM / name).exists()
    # the guardian is told, with the next line it gets
    shm._guardian.tell("+" + shm.new_segment_name())
    assert name not in shm._guardian._live


def test_a_ring_dropped_before_its_consumer_attached_leaves_no_name():
    from rlinf.comm._internal.ring import ShmRing

    ring = ShmRing.create(slots=2, slot_bytes=64)
    name = ring.name
    assert (SHM / name).exists()
    del ring
    gc.collect()
    assert not (SHM / name).exists()


def test_a_forked_child_dropping_its_copy_keeps_the_parents_name():
    seg = shm.Segment(1 << 20)
    pid = os.fork()
    if pid == 0:  # child: drop its copy of the object and collect it
        try:
            del seg
            gc.collect()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (SHM / seg.name).exists()
    seg.unlink()
