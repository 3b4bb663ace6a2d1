"""The local backend: a `WorkerGroup` launched without Ray runs its ranks as processes
forked from one server, with Ray's semantics for results, errors and deaths."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import ClassVar

import psutil
import pytest

from rlinf.sched.placement import parse_placement
from rlinf.workers.errors import ConfigError, WorkerCallError, WorkerDiedError
from rlinf.workers.runtime import RANK_ZERO, WorkerGroup
from rlinf.workers.runtime.backend import BACKEND_ENV, wants_ray
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.runtime.local import LocalActor, gpu_env
from rlinf.workers.runtime.shared import SharedMember
from rlinf.workers.runtime.worker import Worker

from ..leaks import eventually
from .parent_worker import Parent


class Echo(Worker):
    def __init__(self, context: WorkerContext, *, scale: int = 1) -> None:
        super().__init__(context)
        self.scale = scale

    def where(self) -> tuple[int, int, str | None]:
        return self.rank, os.getpid(), os.environ.get("RLINF_TEST_MARK")

    def times(self, x: int) -> int:
        return x * self.scale * (self.rank + 1)

    def fail(self) -> None:
        raise KeyError("no such key in rank")

    def say(self, text: str) -> None:
        print(text, flush=True)

    def die(self) -> None:
        os._exit(7)

    def unpicklable(self) -> object:
        return threading.Lock()

    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank


class Broken(Worker):
    def __init__(self, context: WorkerContext) -> None:
        super().__init__(context)
        raise ValueError("bad model path /nowhere")


class Gate(Worker):
    """Two members of one process: `wait` blocks until the other member `open`s (they meet
    in the class, made in the rank: an event does not pickle)."""

    events: ClassVar[dict[str, threading.Event]] = {}

    def wait(self) -> bool:
        return Gate.events.setdefault("gate", threading.Event()).wait(timeout=20.0)

    def open(self) -> int:
        Gate.events.setdefault("gate", threading.Event()).set()
        return os.getpid()


@pytest.fixture(autouse=True)
def no_ray() -> None:
    import ray

    if ray.is_initialized():
        pytest.skip("this process is connected to Ray: groups would run on it")


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_a_group_without_ray_runs_its_ranks_as_local_processes() -> None:
    import ray

    group = WorkerGroup.launch(Echo, role="echo", num_ranks=2, init_kwargs={"scale": 3},
                               env_vars={"RLINF_TEST_MARK": "set"}, launch_timeout=60)
    try:
        where = group.call("where")
        assert [w[0] for w in where] == [0, 1]
        pids = [w[1] for w in where]
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert [w[2] for w in where] == ["set", "set"]
        assert group.call("times", 5) == [15, 30]
        assert group.call("times", 2, spec=RANK_ZERO) == 6
        assert not ray.is_initialized()
    finally:
        group.kill()
    assert _gone(pids)


def test_a_raising_method_fails_the_call_with_its_exception_and_the_rank_lives_on() -> None:
    group = WorkerGroup.launch(Echo, role="echo", num_ranks=1, launch_timeout=60)
    try:
        with pytest.raises(WorkerCallError, match="no such key in rank") as caught:
            group.call("fail")
        assert isinstance(caught.value.cause, KeyError)
        with pytest.raises(WorkerCallError, match="does not pickle"):
            group.call("unpicklable")
        assert group.call("times", 1) == [1]
    finally:
        group.kill()


def test_constructor_arguments_that_do_not_pickle_fail_the_launch_and_start_nothing() -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(TypeError, match="pickle"):
        WorkerGroup.launch(Echo, role="echo", num_ranks=1, init_kwargs={"scale": threading.Lock()},
                           launch_timeout=60)
    assert _gone([p.pid for p in psutil.Process().children(recursive=True)
                  if p.pid not in before and "forkserver" not in " ".join(p.cmdline())])


def test_a_call_outlasting_a_ray_cluster_this_process_left_is_not_cluster_lost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that used a Ray cluster earlier (a test, a notebook) and left it runs local
    groups: their calls do not watch that cluster, gone or not."""
    import socket

    from rlinf.workers.runtime import ray_session

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setattr(ray_session, "_last", ray_session._Connection(address=closed))
    group = WorkerGroup.launch(Echo, role="echo", num_ranks=1, launch_timeout=60)
    try:
        assert group.call("nap", 5.0, timeout=60) == [0]  # past the watch's 3 s of grace
    finally:
        group.kill()


def test_a_rank_that_exits_is_a_worker_died_error_with_its_exit_status() -> None:
    group = WorkerGroup.launch(Echo, role="echo", num_ranks=2, launch_timeout=60)
    try:
        with pytest.raises(WorkerDiedError, match="exited with code 7") as caught:
            group.call("die", spec=RANK_ZERO, timeout=30)
        assert caught.value.role == "echo" and caught.value.rank == 0
        with pytest.raises(WorkerDiedError):  # the dead rank answers no later call
            group.call("times", 1, timeout=30)
    finally:
        group.kill()


def test_a_constructor_that_raises_is_named_with_its_message() -> None:
    with pytest.raises(WorkerDiedError, match="bad model path /nowhere") as caught:
        WorkerGroup.launch(Broken, role="broken", num_ranks=1, launch_timeout=60)
    assert caught.value.method == "__init__"
    assert str(caught.value).count("its constructor raised") == 1


def test_members_of_a_shared_process_run_side_by_side_in_one_process() -> None:
    placement = parse_placement("a,b: 0", components=["a", "b"], num_devices=1).components["a"]
    groups = WorkerGroup.launch_shared(
        [SharedMember(Gate, "a", {}), SharedMember(Gate, "b", {})], placement=placement,
        launch_timeout=60)
    try:
        waiting = groups["a"].call_async("wait")
        opener = groups["b"].call("open", timeout=30)
        assert waiting.result(timeout=30) == [True]
        assert groups["a"].infos[0].pid == opener[0]
    finally:
        groups["a"].kill()


def test_killing_an_actor_leaves_no_process_and_fails_its_pending_calls() -> None:
    actor = LocalActor(dict, (), {}, name="test-kill-0")
    from rlinf.workers.runtime import refs

    assert refs.get(actor.get.remote("x"), timeout=60) is None
    pid = actor.pid
    assert pid is not None
    actor.kill()
    assert _gone([pid])
    with pytest.raises(Exception, match=r"killed by SIGKILL|pipe closed"):
        refs.get(actor.get.remote("x"), timeout=30)


def test_a_rank_that_wrote_nothing_leaves_no_log_and_one_that_did_keeps_it() -> None:
    quiet = WorkerGroup.launch(Echo, role="quiet", num_ranks=2, launch_timeout=60)
    talker = WorkerGroup.launch(Echo, role="talker", num_ranks=1, launch_timeout=60)
    logs: list[Path] = [actor.log_path for actor in (*quiet.actors, *talker.actors)]
    assert all(path.exists() for path in logs)
    talker.call("say", "a line worth keeping", spec=RANK_ZERO)
    quiet.shutdown()
    talker.kill()
    assert eventually(lambda: not logs[0].exists() and not logs[1].exists())
    assert "a line worth keeping" in logs[2].read_text()
    logs[2].unlink()


def test_live_ranks_lists_the_ranks_and_what_they_started_until_they_are_gone() -> None:
    from rlinf.workers.runtime.local import live_ranks

    before = set(live_ranks())
    group = WorkerGroup.launch(Parent, role="parent", num_ranks=1, launch_timeout=60)
    child = group.call("start_child", spec=RANK_ZERO)
    started = set(live_ranks()) - before
    assert any(name.startswith("Parent[") for name in started), started
    assert any(name.endswith(f"[{child}]") for name in started), started
    group.kill()
    assert eventually(lambda: not set(live_ranks()) - before)


def test_the_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert not wants_ray({})
    assert wants_ray({"address": "10.0.0.1:6379"})
    monkeypatch.setenv(BACKEND_ENV, "ray")
    assert wants_ray({})
    monkeypatch.setenv(BACKEND_ENV, "local")
    with pytest.raises(ConfigError, match="unset RAY_ADDRESS"):
        wants_ray({"address": "10.0.0.1:6379"})
    monkeypatch.setenv(BACKEND_ENV, "kubernetes")
    with pytest.raises(ConfigError, match="one of"):
        wants_ray({})


def _in_a_fresh_process(script: str, **env: str) -> str:
    import subprocess
    import sys

    environ = {k: v for k, v in os.environ.items()
               if k not in ("RAY_ADDRESS", BACKEND_ENV)} | env
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True, env=environ).stdout.split()[-1]


def test_the_fork_server_starts_early_only_where_the_ranks_will_be_local() -> None:
    """A CLI starts its ranks' imports before composing its config (`start_local_early`),
    unless something asks for Ray already; asking never imports Ray."""
    script = ("import sys\n"
              "from rlinf.workers.runtime.backend import start_local_early\n"
              "print(f\"{start_local_early(['json'])},{'ray' in sys.modules}\")\n")
    assert _in_a_fresh_process(script) == "True,False"
    assert _in_a_fresh_process(script, RLINF_BACKEND="ray") == "False,False"
    assert _in_a_fresh_process(script, RAY_ADDRESS="10.0.0.1:6379") == "False,False"
    # a bad choice is the run's own error later, said once: nothing starts here
    assert _in_a_fresh_process(script, RLINF_BACKEND="kubernetes") == "False,False"


def test_a_run_of_local_ranks_never_imports_ray() -> None:
    """Neither the driver nor the fork server pays for Ray's import."""
    script = ("import sys\n"
              "from rlinf.workers.runtime import RANK_ZERO, WorkerGroup\n"
              "from rlinf.workers.runtime.worker import Worker\n"
              "group = WorkerGroup.launch(Worker, role='w', num_ranks=2, launch_timeout=60)\n"
              "group.call('resident_memory_bytes', spec=RANK_ZERO)\n"
              "group.shutdown()\n"
              "print('ray' in sys.modules)\n")
    assert _in_a_fresh_process(script) == "False"


def test_gpu_env_names_the_devices_through_the_drivers_own_visibility(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_env((0, 2)) == {"CUDA_VISIBLE_DEVICES": "0,2"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert gpu_env((1,)) == {"CUDA_VISIBLE_DEVICES": "5"}


def test_a_rank_is_named_after_the_class_it_serves() -> None:
    group = WorkerGroup.launch(Echo, role="echo", num_ranks=1, launch_timeout=60)
    try:
        assert psutil.Process(group.infos[0].pid).name() == "Echo"
    finally:
        group.kill()


def test_a_driver_that_exits_without_killing_its_ranks_takes_them_along() -> None:
    import subprocess
    import sys

    script = ("from rlinf.workers.runtime.local import LocalActor\n"
              "from rlinf.workers.runtime import refs\n"
              "a = LocalActor(dict, (), {}, name='test-exit-0')\n"
              "refs.get(a.get.remote('x'), timeout=60)\n"
              "print(a.pid, flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    assert _gone([int(proc.stdout.split()[-1])])


def test_a_driver_that_exits_while_the_server_imports_frees_its_output_at_once(
        tmp_path: Path) -> None:
    """A config error ends the driver seconds before the server's imports would finish: the
    server goes with it, so a reader of the driver's output (a pipe) is not held up."""
    import subprocess
    import sys

    (tmp_path / "slow_import.py").write_text(
        f"import os, time\nopen({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(60)\n")
    # Run from `tmp_path`: the server (``python -c``) imports from its working directory.
    script = ("import time\n"
              "from rlinf.workers.runtime.local import start_server\n"
              "start_server(['slow_import'])\n"
              f"while not __import__('os').path.exists({str(tmp_path / 'pid')!r}):\n"
              "    time.sleep(0.05)\n"
              "print('bye', flush=True)\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True, cwd=tmp_path)
    assert proc.stdout.splitlines()[-1] == "bye"
    assert time.monotonic() - started < 45  # the server's import alone takes 60 s
    assert _gone([int((tmp_path / "pid").read_text())])


def test_what_a_rank_started_dies_with_it() -> None:
    group = WorkerGroup.launch(Parent, role="parent", num_ranks=1, launch_timeout=60)
    child = group.call("start_child", spec=RANK_ZERO)
    group.kill()
    assert _gone([child])


def test_a_driver_killed_outright_takes_its_ranks_and_their_children_along() -> None:
    import signal
    import subprocess
    import sys

    here = os.path.dirname(__file__)
    script = ("import sys, time\n"
              f"sys.path.insert(0, {here!r})\n"
              "from parent_worker import Parent\n"
              "from rlinf.workers.runtime import RANK_ZERO, WorkerGroup\n"
              "g = WorkerGroup.launch(Parent, role='p', num_ranks=1, launch_timeout=60)\n"
              "print('pids', g.infos[0].pid, g.call('start_child', spec=RANK_ZERO), flush=True)\n"
              "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = next(line for line in proc.stdout if line.startswith("pids "))
    pids = [int(p) for p in line.split()[1:]]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert _gone(pids)
