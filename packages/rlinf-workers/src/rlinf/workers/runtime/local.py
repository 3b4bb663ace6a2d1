"""Ranks as processes of this machine, without Ray: the single-node backend of `WorkerGroup`.

A run on one machine needs none of Ray's services (a control store, a raylet, an object
store, a process per idle worker), yet starting them took seconds and several CPU-seconds
before anything trained, and each Ray worker imported torch and the roles again. Here
every rank is a process forked from one server (multiprocessing's ``forkserver``) that
imported torch, the flow runtime and the run's roles once (`start_server`, called early by
the CLI so the import overlaps the driver's own), so a rank starts in milliseconds with
those modules loaded. The server is forked only after its single-threaded imports, so no
thread pool is inherited half-held.

A `LocalActor` mirrors the part of a Ray actor handle that `WorkerGroup` uses:
``actor.method.remote(*args)`` returns a `LocalRef` (a future), `kill` kills the process.
The instance is built in the process's main thread before any call runs; calls run in
order on the main thread (``max_concurrency=1``, as Ray runs a plain actor) or on a pool
of that many threads (a shared process, whose members wait on each other's channels).
Arguments and results travel pickled (cloudpickle, as Ray's) over a pipe; the data of a
flow goes over its channels, not here. A method that raises resolves its ref with
`LocalCallError` carrying the exception; a process that dies (crash, ``os._exit``,
SIGKILL, its constructor raising) resolves every pending ref with `LocalActorDied`, whose
detail is the exit status and the last lines of the process's log. A rank's stdout and
stderr go to a log file (`LOG_DIR`) as Ray's go to its session's logs; a rank ignores
SIGINT (the driver owns Ctrl-C and kills its ranks) and exits when the driver's end of
its pipe closes, so no rank outlives its driver. Each rank leads a process group of its
own, killed whole (a kill, a death, the driver gone): what a rank started (an env's
subprocess, a pool's worker) goes with it, as Ray kills a worker's children.

What a process reads only when it execs (`AT_EXEC`: the allocator's ``LD_PRELOAD`` and
``MALLOC_CONF``) is the server's, set when it started, and every rank forked from it has
the same. A rank that asks for other values (a group launched with another allocator) is
started fresh instead (multiprocessing's ``spawn`` with those values), at the cost of
importing what it needs itself.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import sys
import tempfile
import threading
import traceback
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import cloudpickle
import structlog

__all__ = ["AT_EXEC", "LOG_DIR", "PRELOAD", "LocalActor", "LocalActorDied", "LocalCallError",
           "LocalRef", "gpu_env", "live_ranks", "start_server"]

_log = structlog.get_logger(__name__)

PRELOAD: tuple[str, ...] = ("rlinf.workers.flow.worker",)
"""What the fork server imports before it forks a rank (torch, the flow runtime), with the
modules its starter adds (the roles, the model code)."""

LOG_DIR = Path(tempfile.gettempdir()) / f"rlinf-logs-{os.getuid()}"
"""Where each rank's stdout and stderr go, one file per rank (its group name and rank); a
rank that wrote nothing leaves none once it has ended."""

_TAIL_LINES = 6
_LIVE: weakref.WeakSet[LocalActor] = weakref.WeakSet()
"""Ranks not killed yet: killed when the driver exits, as Ray's die with their driver
(multiprocessing would otherwise wait at exit for ranks that wait for the driver)."""
_server_lock = threading.Lock()
_server_modules: list[tuple[str, ...]] = []
"""What the fork server of this process preloads, once it was started (one entry)."""
AT_EXEC = frozenset({"LD_PRELOAD", "MALLOC_CONF"})
"""Environment variables a process reads only when it execs: a forked rank has the server's."""
_server_exec_env: dict[str, str] = {}
"""The `AT_EXEC` variables the fork server was started with (beside the driver's own)."""


def _context() -> Any:
    return multiprocessing.get_context("forkserver")


def _exec_env(env: Mapping[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if key in AT_EXEC}


def start_server(modules: Iterable[str] = (), *, env: Mapping[str, str] | None = None) -> bool:
    """Start the fork server in the background, importing `PRELOAD` and `modules` before
    it forks any rank, with `env` added to its environment (what every rank inherits and
    must have at exec, e.g. ``LD_PRELOAD`` of an allocator). Returns whether it started
    here; later calls (and later `modules`) change nothing: a server is started once per
    process. Never waits for the imports: the first rank does."""
    from multiprocessing import forkserver

    with _server_lock:
        if _server_modules:
            return False
        wanted = tuple(dict.fromkeys([*PRELOAD, *modules]))
        _server_modules.append(wanted)
        _server_exec_env.update(_exec_env(env or {}))
        ctx = _context()
        ctx.set_forkserver_preload(list(wanted))
        with _environ(env or {}):  # the server execs with it; ranks inherit it
            forkserver.ensure_running()
        _log.debug("local_fork_server_started", preload=list(wanted))
        return True


def gpu_env(devices: Sequence[int]) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` for a rank that computes on the GPUs `devices` (indices of
    this machine's GPUs as this process sees them, so a driver's own
    ``CUDA_VISIBLE_DEVICES`` is honoured), as Ray sets it for a rank that reserves GPUs."""
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [part.strip() for part in seen.split(",")] if seen else None
    chosen = [names[d] if names is not None and d < len(names) else str(d) for d in devices]
    return {"CUDA_VISIBLE_DEVICES": ",".join(chosen)}


class LocalCallError(Exception):
    """A rank's method raised `cause` (its traceback text in `remote_traceback`)."""

    def __init__(self, cause: BaseException, remote_traceback: str) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
        self.remote_traceback = remote_traceback


class LocalActorDied(Exception):
    """A rank's process is gone; `actor_init_failed` when its constructor raised."""

    def __init__(self, detail: str, *, actor_init_failed: bool = False) -> None:
        super().__init__(detail)
        self.actor_init_failed = actor_init_failed


class LocalRef:
    """The pending result of one call on a `LocalActor` (hashable, like a Ray object ref)."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: cf.Future[Any] = cf.Future()

    def __repr__(self) -> str:
        return f"LocalRef(done={self.future.done()})"


class _Method:
    __slots__ = ("_actor", "_name")

    def __init__(self, actor: LocalActor, name: str) -> None:
        self._actor, self._name = actor, name

    def remote(self, *args: Any, **kwargs: Any) -> LocalRef:
        return self._actor.submit(self._name, args, kwargs)


class LocalActor:
    """One rank: a forked process holding ``cls(*args, **kwargs)``, called by method name.

    `env` is set in the rank before `cls` is built; its `AT_EXEC` variables, when they
    differ from the fork server's, make the rank a fresh process started with them.
    """

    def __init__(self, cls: type, args: Sequence[Any], kwargs: Mapping[str, Any], *,
                 name: str, env: Mapping[str, str] | None = None,
                 max_concurrency: int = 1) -> None:
        start_server()
        at_exec = _exec_env(env or {})
        fresh = at_exec != _server_exec_env
        ctx = multiprocessing.get_context("spawn") if fresh else _context()
        env = {key: value for key, value in (env or {}).items() if key not in AT_EXEC}
        self.name = name
        self.log_path = LOG_DIR / f"{name}.log"
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        # Pickled before the process starts: arguments that do not pickle fail the launch
        # and leave no process behind. The driver's import path first (it may have grown
        # since the server started: a test folder, a user's module), then what needs it.
        constructor = cloudpickle.dumps((list(sys.path), cloudpickle.dumps(
            (cls, tuple(args), dict(kwargs), dict(env), max(int(max_concurrency), 1)))))
        self._send_lock = threading.Lock()
        self._wait_lock = threading.Lock()
        self._pending: dict[int, LocalRef] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count()
        self._dead: LocalActorDied | None = None
        mine, theirs = ctx.Pipe(duplex=True)
        self._conn = mine
        self._process = ctx.Process(target=_serve, args=(theirs, str(self.log_path)),
                                    name=f"rlinf:{name}", daemon=False)
        _start_without_main(self._process, exec_env=at_exec if fresh else None)
        _LIVE.add(self)  # from now on killed at exit, whatever fails below
        if fresh:
            _log.debug("local_rank_spawned", actor=name, exec_env=at_exec,
                       server_exec_env=dict(_server_exec_env))
        theirs.close()
        self._conn.send_bytes(constructor)
        self._reader = threading.Thread(target=self._read, name=f"rlinf-local-{name}",
                                        daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    def submit(self, method: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> LocalRef:
        """Start `method` in the rank; the ref resolves with its result or error."""
        ref = LocalRef()
        with self._pending_lock:
            if self._dead is not None:
                ref.future.set_exception(self._dead)
                return ref
            call_id = next(self._ids)
            self._pending[call_id] = ref
        try:
            data = cloudpickle.dumps((call_id, method, tuple(args), dict(kwargs)))
            with self._send_lock:
                self._conn.send_bytes(data)
        except (OSError, ValueError) as exc:  # the pipe is gone: the reader says why
            _log.debug("local_call_unsent", actor=self.name, method=method, error=str(exc))
        except Exception:  # arguments that do not pickle fail this call only
            with self._pending_lock:
                self._pending.pop(call_id, None)
            raise
        return ref

    def kill(self) -> None:
        """Kill the process now (SIGKILL, no cleanup hooks); idempotent."""
        _LIVE.discard(self)
        self._kill_group()
        with contextlib.suppress(Exception):
            self._process.kill()
        self._join(5.0)
        with contextlib.suppress(Exception):
            self._conn.close()
        self._drop_empty_log()

    def _drop_empty_log(self) -> None:
        """Remove the rank's log once it has ended, if it wrote nothing: runs would
        otherwise leave a file per rank behind for good. A log with something in it stays
        (a warning, the traceback of a death)."""
        with self._wait_lock:
            if self._process.exitcode is None:
                return
        with contextlib.suppress(OSError):
            if self.log_path.stat().st_size == 0:
                self.log_path.unlink()

    def _kill_group(self) -> None:
        """SIGKILL the rank's process group: the rank and every process it started (an
        env's subprocess, a pool's worker), which would otherwise outlive it, as Ray kills
        a worker's children with it."""
        if self._process.pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(self._process.pid, signal.SIGKILL)

    def _join(self, timeout: float) -> None:
        # One thread at a time: the exit status is read once from the fork server's pipe,
        # and a second reader would take its end for a status of 255.
        with self._wait_lock, contextlib.suppress(Exception):
            self._process.join(timeout=timeout)

    def _read(self) -> None:
        init_failed: str | None = None
        while True:
            try:
                message = cloudpickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "init_failed":
                init_failed = message[1]
                continue
            ref = self._take(message[1])
            if ref is None:
                continue
            if kind == "ok":
                try:
                    ref.future.set_result(cloudpickle.loads(message[2]))
                except Exception as exc:
                    ref.future.set_exception(LocalCallError(RuntimeError(
                        f"its result does not unpickle in the driver: {exc!r}"), ""))
                continue
            pickled, remote_traceback, summary = message[2:]
            cause: BaseException = RuntimeError(summary)
            if pickled is not None:
                with contextlib.suppress(Exception):
                    cause = cloudpickle.loads(pickled)
            ref.future.set_exception(LocalCallError(cause, remote_traceback))
        self._join(2.0)
        self._kill_group()  # what the rank started dies with it
        died = LocalActorDied(
            f"its constructor raised {init_failed}" if init_failed is not None
            else self._death_detail(), actor_init_failed=init_failed is not None)
        with self._pending_lock:
            self._dead = died
            pending, self._pending = list(self._pending.values()), {}
        for ref in pending:
            ref.future.set_exception(died)
        self._drop_empty_log()

    def _take(self, call_id: int) -> LocalRef | None:
        with self._pending_lock:
            return self._pending.pop(call_id, None)

    def _death_detail(self) -> str:
        with self._wait_lock:
            code = self._process.exitcode
        if code is None:
            status = "stopped answering (its pipe closed)"
        elif code < 0:
            status = f"was killed by {signal.Signals(-code).name}"
        else:
            status = f"exited with code {code}"
        log = "; it wrote nothing to its log"  # (so the empty log is removed)
        with contextlib.suppress(OSError):
            lines = [line for line in self.log_path.read_text(errors="replace").splitlines()
                     if line.strip()]
            if lines:
                log = (f"; log {self.log_path}, which ends: "
                       + " | ".join(lines[-_TAIL_LINES:]))
        return f"the process (pid {self._process.pid}) {status}{log}"


_start_lock = threading.Lock()


def _start_without_main(process: Any, *, exec_env: Mapping[str, str] | None = None) -> None:
    """Start `process` without re-importing the driver's ``__main__`` in it, which
    multiprocessing does for every child it does not fork from the parent itself: the
    rank's code is this module's, and a ``python -m app.cli`` main would be imported
    again in every rank (a script read from stdin could not be). A spawned process execs
    with `exec_env` in its environment."""
    from multiprocessing import spawn

    with _start_lock, _environ(exec_env or {}):
        original = spawn.get_preparation_data

        def without_main(name: str) -> dict[str, Any]:
            data = dict(original(name))
            data.pop("init_main_from_name", None)
            data.pop("init_main_from_path", None)
            return data

        spawn.get_preparation_data = without_main
        try:
            process.start()
        finally:
            spawn.get_preparation_data = original


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in this process's environment for the block (what a child execs with)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _serve(conn: multiprocessing.connection.Connection, log_path: str) -> None:
    """A rank's process: build the instance, then run calls until the driver's pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # a group of its own: killed with what it starts
        os.setpgid(0, 0)
    with contextlib.suppress(OSError):
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    try:
        path, payload = cloudpickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        os._exit(0)
    sys.path[:] = list(dict.fromkeys([*path, *sys.path]))
    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        data = cloudpickle.dumps(message)
        with send_lock:
            conn.send_bytes(data)

    try:
        cls, args, kwargs, env, concurrency = cloudpickle.loads(payload)
    except BaseException as exc:  # a class or argument this process cannot import
        traceback.print_exc()
        send(("init_failed", f"{type(exc).__name__}: {exc}"))
        _exit(1)
    os.environ.update(env)
    _name_process(cls.__name__)
    try:
        instance = cls(*args, **kwargs)
    except BaseException as exc:
        traceback.print_exc()
        send(("init_failed", f"{type(exc).__name__}: {exc}"))
        _exit(1)
    calls: queue.SimpleQueue[tuple[int, str, tuple[Any, ...], dict[str, Any]] | None] = (
        queue.SimpleQueue())

    def read() -> None:
        while True:
            try:
                calls.put(cloudpickle.loads(conn.recv_bytes()))
            except (EOFError, OSError):  # the driver is gone: so are this rank and its own,
                _exit(0, group=True)     # whatever the main thread is blocked in

    def run(call_id: int, method: str, a: tuple[Any, ...], kw: dict[str, Any]) -> None:
        # Results and errors travel pickled on their own, so that one the driver cannot
        # unpickle fails its call only, named, instead of the whole message stream.
        try:
            result = getattr(instance, method)(*a, **kw)
        except BaseException as exc:
            try:
                pickled: bytes | None = cloudpickle.dumps(exc)
            except Exception:
                pickled = None
            send(("err", call_id, pickled, traceback.format_exc(),
                  f"{type(exc).__name__}: {exc}"))
            return
        try:
            send(("ok", call_id, cloudpickle.dumps(result)))
        except Exception as exc:
            send(("err", call_id, None, traceback.format_exc(),
                  f"its result ({type(result).__name__}) does not pickle: {exc}"))

    threading.Thread(target=read, name="rlinf-local-reader", daemon=True).start()
    pool = cf.ThreadPoolExecutor(concurrency) if concurrency > 1 else None
    while (call := calls.get()) is not None:
        if pool is None:
            run(*call)
        else:
            pool.submit(run, *call)
    _exit(0)


@atexit.register
def _kill_left_ranks() -> None:
    for actor in list(_LIVE):
        actor.kill()
    _stop_server()


def live_ranks() -> list[str]:
    """``name[pid]`` of every process this driver's local backend started that is still
    alive: its ranks (registered until killed) and, where psutil is installed, whatever
    the fork server forked and those started in turn (an env's subprocess): what a test
    checks is gone after a run. Zombies (ended, not yet reaped) do not count."""
    left = {f"{actor.name}[{actor.pid}]": None for actor in list(_LIVE)
            if actor.pid is not None and _running(actor.pid)}
    from multiprocessing import forkserver

    server = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if server is not None and _server_modules:
        try:
            import psutil
        except ImportError:
            return list(left)
        with contextlib.suppress(psutil.Error):
            for process in psutil.Process(server).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if process.status() != psutil.STATUS_ZOMBIE:
                        left[f"{process.name()}[{process.pid}]"] = None
    return list(left)


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is no zombie (Linux: its ``/proc`` state)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _stop_server() -> None:
    """The fork server goes with the driver at once, even mid-import. Left to notice the
    driver's exit itself, it first finishes its imports (seconds, for nobody), holding the
    driver's stdout and stderr open meanwhile: a reader of their pipe (``| tee``, a test's
    subprocess) waited that long after a config error had ended the driver."""
    from multiprocessing import forkserver

    if not _server_modules:  # not started by this process (or this is the server itself)
        return
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.waitpid(pid, 0)


def _name_process(name: str) -> None:
    """Name this process after the class it serves (``ps -o comm``, `psutil.Process.name`:
    15 characters), as Ray titles its workers, so a user can tell the ranks apart."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None)
        pr_set_name = 15
        libc.prctl(pr_set_name, name.encode()[:15], 0, 0, 0)


def _exit(code: int, *, group: bool = False) -> NoReturn:
    """Leave at once (as Ray's kill does): threads may be blocked on channels forever;
    `group`: with every process this rank started."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    if group:
        with contextlib.suppress(OSError):
            os.killpg(0, signal.SIGKILL)
    os._exit(code)
