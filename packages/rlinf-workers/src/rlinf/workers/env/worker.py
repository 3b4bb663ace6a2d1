"""`EnvWorker`: owns a vector env split into pipeline stages and drives the rollout protocol.

Protocol of one rollout of `num_steps` steps over stage groups ``0..G-1`` (keys `stage_key`):

1. send every group's current observations (one `Batch` per group);
2. for each step, for each group g in order: receive g's actions, step g, send g's next
   observations. While group g steps, the policy is computing the actions of group g+1,
   which is where pipelining overlaps simulation with inference. With the envs in worker
   processes each group runs this loop in its own thread instead (`concurrent_groups`), so
   a group that resets for seconds holds up no other;
3. receive one last reply per group to the observations after the last step (its
   ``meta["bootstrap"]`` was True): the values GAE bootstraps from.

Observation batches hold ``obs``, ``final_obs`` and ``final_mask`` (the last observation of
episodes that ended at the previous step, for bootstrapping truncations) and ``env_index``;
replies hold ``action``, ``log_prob``, ``value`` and ``final_value`` (the value of
``final_obs``). Simulators run on the CPU, so `onload`/`offload` have nothing to move; they
exist so the device lock can drive every worker alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from rlinf.comm import Batch
from rlinf.envs.embodied import EpisodeStats, VectorEnv, make_vector_env
from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.env.group_threads import GroupThreads
from rlinf.workers.env.link import ActionSource, ObsSink, stage_key
from rlinf.workers.env.pixels import make_pixel_env
from rlinf.workers.env.same_start import make_same_start_env
from rlinf.workers.env.state import capture_env_state, restore_env_state
from rlinf.workers.env.trajectory import Trajectory, TrajectoryBuilder
from rlinf.workers.errors import ConfigError, ShapeError
from rlinf.workers.runtime.context import WorkerContext
from rlinf.workers.runtime.worker import Worker

if TYPE_CHECKING:
    from rlinf.workers.telemetry import TraceRecorder

__all__ = ["EnvRollout", "EnvWorker"]


@dataclass(frozen=True)
class EnvRollout:
    """What `EnvWorker.rollout` returns."""

    trajectories: tuple[Trajectory, ...]
    """One per stage group, in group order (`Trajectory.concat` joins them)."""
    episodes: tuple[EpisodeStats, ...]
    """Episodes that finished during the rollout."""
    env_steps: int
    """Env steps taken (num_envs * num_steps)."""
    seconds: float
    """Wall time of the rollout, waiting for the policy included."""
    step_seconds: float
    """Time spent inside the simulators' `step`."""
    wait_seconds: float
    """Time spent waiting for actions (policy inference not hidden behind simulation)."""

    @property
    def steps_per_s(self) -> float:
        """Env steps per second of wall time."""
        return self.env_steps / self.seconds if self.seconds > 0 else 0.0


class EnvWorker(Worker):
    """Runs `config.num_envs` simulators in `config.pipeline_stages` groups (module docstring)."""

    def __init__(self, context: WorkerContext, *, config: EnvWorkerConfig) -> None:
        super().__init__(context)
        self.config = config
        if config.pixels is not None:
            self.env: VectorEnv = make_pixel_env(config)
        elif config.same_start_group_size > 1:
            if config.processes > 1:
                raise ConfigError("same-start blocks of state observations step in this "
                                  "process (batched MuJoCo): set processes=1")
            self.env = make_same_start_env(config)
        else:
            self.env = make_vector_env(
                config.env_name, num_envs=config.num_envs, seed=config.seed,
                max_episode_steps=config.max_episode_steps, env_kwargs=config.env_kwargs,
                threads=config.threads, processes=config.processes,
                stage_groups=config.process_stage_groups)
        if isinstance(self.env.single_observation_space, gym.spaces.Dict):
            self.env.close()
            raise ConfigError(f"{config.env_name!r} has dict observations; the env worker "
                              "sends array observations only")
        self.groups = self.env.split(config.pipeline_stages)
        offsets = config.first_env + np.cumsum([0] + [g.num_envs for g in self.groups])
        self._indices = [np.arange(offsets[i], offsets[i + 1]) for i in range(len(self.groups))]
        self._obs: list[npt.NDArray[Any]] | None = None
        self._resident = True
        space = self.env.single_action_space
        self._bounds = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None

    @property
    def observation_space(self) -> gym.Space[Any]:
        """Observation space of one env."""
        return self.env.single_observation_space

    @property
    def action_space(self) -> gym.Space[Any]:
        """Action space of one env."""
        return self.env.single_action_space

    @property
    def instruction(self) -> str:
        """The task's language instruction: the config's, else the task's own (LIBERO's),
        else the task id."""
        if self.config.instruction:
            return self.config.instruction
        own = self.env.get_attr("instruction") if self.config.pixels is not None else []
        return next((str(text) for text in own if text), self.config.env_name)

    def state(self) -> dict[str, Any]:
        """Simulator state and current observations: `load_state` continues from here exactly
        (gymnasium MuJoCo tasks; see `rlinf.workers.env.state`)."""
        return {"env": capture_env_state(self.env),
                "obs": None if self._obs is None else [o.copy() for o in self._obs]}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state` on an env worker built from the same config."""
        restore_env_state(self.env, state["env"])
        obs = state["obs"]
        self._obs = None if obs is None else [np.array(o) for o in obs]

    def reset(self, *, seed: int | None = None) -> None:
        """Start new episodes in every env (env i seeded with seed + i when given)."""
        self._obs = self._reset(seed)

    def _reset(self, seed: int | None) -> list[npt.NDArray[Any]]:
        obs: list[npt.NDArray[Any]] = [None] * len(self.groups)  # type: ignore[list-item]

        def reset(g: int) -> None:
            obs[g] = np.asarray(self.groups[g].reset(seed=seed)[0])

        if self.concurrent_groups:  # each group's processes reset at once (seconds each)
            GroupThreads().run([partial(reset, g) for g in range(len(self.groups))],
                               name="env-stage-reset")
        else:
            for g in range(len(self.groups)):
                reset(g)
        self.env.pop_finished_episodes()  # episodes cut by the reset are not results
        return obs

    def _message(self, group: int, obs: npt.NDArray[Any], final_obs: npt.NDArray[Any],
                 final_mask: npt.NDArray[np.bool_], *, step: int, bootstrap: bool) -> Batch:
        return Batch(
            {"obs": obs, "final_obs": final_obs, "final_mask": final_mask,
             "env_index": self._indices[group]},
            meta={"stage": group, "step": step, "bootstrap": bootstrap},
        )

    def _action(self, reply: Batch, group: int) -> npt.NDArray[Any]:
        action = np.asarray(reply.tensors["action"])
        expected = self.groups[group].num_envs
        if action.shape[:1] != (expected,):
            raise ShapeError(f"expected {expected} actions for stage {group}, got "
                             f"shape {action.shape}")
        if self._bounds is not None:  # the Gaussian is unbounded; the simulator is not
            return np.clip(action, *self._bounds)
        return action

    @property
    def concurrent_groups(self) -> bool:
        """Whether `rollout` steps the stage groups concurrently, one thread each: when the
        envs live in worker processes (laid out one group per process,
        `rlinf.envs.embodied.processes.process_layout`) and there are several groups. A
        group waiting for a slow step or reset (LIBERO) then holds up no other group;
        in this process the groups would only take turns on the GIL."""
        return (self.config.concurrent_groups and self.config.processes > 1
                and len(self.groups) > 1)

    def rollout(self, *, num_steps: int, sink: ObsSink, source: ActionSource,
                timeout: float | None = 60.0, trace: TraceRecorder | None = None) -> EnvRollout:
        """Run `num_steps` steps of every env through the protocol in the module docstring;
        `trace` records one ``env_step`` span per stage group and step. Step and wait
        seconds are summed over the groups (they overlap when `concurrent_groups`)."""
        if num_steps < 1:
            raise ConfigError(f"num_steps must be >= 1, got {num_steps}")
        obs = self._obs if self._obs is not None else self._reset(None)
        self._obs = obs  # updated in place: the next rollout continues these episodes
        started = time.perf_counter()
        run = _GroupRun(self, obs, num_steps=num_steps, sink=sink, source=source,
                        timeout=timeout, trace=trace)
        for g, group_obs in enumerate(obs):
            sink.put(self._message(g, group_obs, np.zeros_like(group_obs), run.no_final[g],
                                   step=0, bootstrap=False), key=stage_key(g))
        if self.concurrent_groups:
            run.concurrently()
        else:
            for t in range(num_steps):
                for g in range(len(self.groups)):
                    run.step(g, t)
            for g in range(len(self.groups)):
                run.finish(g)
        seconds = time.perf_counter() - started
        # group by group (each in finishing order): the same list whether the groups took
        # turns or ran concurrently
        episodes = tuple(e for group in self.groups for e in group.pop_finished_episodes())
        rollout = EnvRollout(
            trajectories=tuple(run.trajectories), episodes=episodes,
            env_steps=num_steps * self.env.num_envs, seconds=seconds,
            step_seconds=sum(run.step_s), wait_seconds=sum(run.wait_s))
        self.log.info("env_rollout", steps=rollout.env_steps, seconds=round(seconds, 3),
                      steps_per_s=round(rollout.steps_per_s, 1),
                      wait_s=round(rollout.wait_seconds, 3), episodes=len(rollout.episodes),
                      concurrent=self.concurrent_groups)
        return rollout

    def onload(self) -> None:
        """Nothing to move: CPU simulators stay in host memory (kept for the device lock)."""
        self._resident = True

    def offload(self) -> None:
        """Nothing to free on a device for CPU simulators (kept for the device lock)."""
        self._resident = False

    @property
    def resident(self) -> bool:
        """Whether the last context-switch hook was `onload`."""
        return self._resident

    def shutdown(self) -> None:
        """Close the simulators, then the base worker's resources."""
        self.env.close()
        super().shutdown()


class _GroupRun:
    """One rollout's per-group state and protocol steps (`EnvWorker.rollout`): group g's
    step t takes its actions, steps its envs and sends its next observations; `finish`
    takes the bootstrap reply. Groups touch only their own state, so each may run in its
    own thread (`concurrently`)."""

    def __init__(self, worker: EnvWorker, obs: list[npt.NDArray[Any]], *, num_steps: int,
                 sink: ObsSink, source: ActionSource, timeout: float | None,
                 trace: TraceRecorder | None) -> None:
        self.worker, self.obs, self.num_steps = worker, obs, num_steps
        self.sink, self.source, self.timeout, self.trace = sink, source, timeout, trace
        count = len(worker.groups)
        self.builders = [TrajectoryBuilder(ix.tolist()) for ix in worker._indices]
        self.no_final = [np.zeros(len(ix), dtype=bool) for ix in worker._indices]
        self.step_s, self.wait_s = [0.0] * count, [0.0] * count
        self.trajectories: list[Trajectory] = [None] * count  # type: ignore[list-item]
        self._threads: GroupThreads | None = None

    def _reply(self, g: int) -> Batch:
        if self._threads is None:
            return self.source.get(key=stage_key(g), timeout=self.timeout)
        return self._threads.get(self.source, key=stage_key(g), timeout=self.timeout)

    def step(self, g: int, t: int) -> None:
        worker = self.worker
        waited = time.perf_counter()
        wall = time.time()
        reply = self._reply(g)
        began = time.perf_counter()
        self.builders[g].add_policy(self.obs[g], dict(reply.tensors))
        result = worker.groups[g].step(worker._action(reply, g))
        ended = time.perf_counter()
        self.wait_s[g] += began - waited
        self.step_s[g] += ended - began
        if self.trace is not None:
            self.trace.add("env_step", wall + (began - waited), wall + (ended - waited),
                           stage=g, step=t)
        self.builders[g].add_step(result.reward, result.terminated, result.truncated)
        self.obs[g] = np.asarray(result.obs)
        self.sink.put(worker._message(g, self.obs[g], np.asarray(result.info["final_obs"]),
                                      result.done, step=t + 1,
                                      bootstrap=t == self.num_steps - 1), key=stage_key(g))

    def finish(self, g: int) -> None:
        waited = time.perf_counter()
        reply = self._reply(g)
        self.wait_s[g] += time.perf_counter() - waited
        self.trajectories[g] = self.builders[g].finish(dict(reply.tensors))

    def _run_group(self, g: int) -> None:
        for t in range(self.num_steps):
            self.step(g, t)
        self.finish(g)

    def concurrently(self) -> None:
        """Every group's steps in its own thread (`GroupThreads`)."""
        self._threads = GroupThreads()
        self._threads.run([partial(self._run_group, g) for g in range(len(self.worker.groups))],
                          name="env-stage-group")
