"""The profile `auto` plans an embodied flow with, measured on a launched `FlowRun`.

`profile_run` times the components on fresh copies in the driver (`measure_components`:
env stage groups, policy micro-batches and actor updates of each size), the run's iteration
overhead, and what only the launched processes show: with a policy process, the env ↔
policy link's round trips (`LINK` entries, which `rlinf.workers.training.pricing.
link_cluster` fits); with ``data_parallel`` > 1, env and policy timed on that many processes
at once (`measure_parallel`); with ``probe_iterations`` > 1, real iterations of the run
(`rlinf.workers.flow.auto.probe_iterations`: inline they price the hand-overs, else the
messages).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from rlinf.sched import Measurement, Profile
from rlinf.workers.embodied.actor import EmbodiedActorConfig
from rlinf.workers.embodied.parallel_profiling import measure_parallel
from rlinf.workers.embodied.profiling import measure_components
from rlinf.workers.embodied.rollout import PolicyRolloutConfig
from rlinf.workers.embodied.vla_policy import VLARolloutConfig
from rlinf.workers.env.config import EnvWorkerConfig
from rlinf.workers.flow.auto import iteration_overhead, probe_iterations
from rlinf.workers.flow.run import FlowRun
from rlinf.workers.runtime import RANK_ZERO

__all__ = ["LINK", "profile_run"]

LINK = "link"
"""Profile entries of the env ↔ policy link's round trips."""


def profile_run(run: FlowRun, *, env: EnvWorkerConfig,
                rollout: PolicyRolloutConfig | VLARolloutConfig, actor: EmbodiedActorConfig,
                rollout_steps: int, batch_sizes: Sequence[int], repeats: int = 5,
                iterations: int = 0, data_parallel: int = 1,
                timeout: float = 60.0) -> Profile:
    """The per-component profile of `run`'s flow (module docstring); `env` is the run's env
    config, timed one stage group at a time, and `timeout` bounds each probe's wait."""
    single = replace(env, pipeline_stages=1)
    profile = measure_components(env=single, rollout=rollout, actor=actor,
                                 rollout_steps=rollout_steps, batch_sizes=batch_sizes,
                                 repeats=repeats)
    extra = list(iteration_overhead(run, repeats=repeats, timeout=timeout).measurements)
    if data_parallel > 1:
        extra += measure_parallel(env=single, rollout=rollout, batch_sizes=batch_sizes,
                                  workers=data_parallel, repeats=repeats)
    inline = "rollout" in run.inlined
    if not inline:
        to_policy, to_env = run.channels["env->rollout"], run.channels["rollout->env"]
        for size in sorted(set(batch_sizes)):
            count = 10 * repeats
            pong = run.group_of("rollout").call_async(
                "echo", count=count, input_channel=to_policy, output_channel=to_env,
                spec=RANK_ZERO)
            rtt = run.group_of("env").call("ping", count=count, batch_size=size,
                                           output_channel=to_policy, input_channel=to_env,
                                           timeout=timeout)[0]
            pong.rank_results(timeout=timeout)
            extra.append(Measurement(LINK, size, 1, float(rtt), 0, memory_source="none",
                                     timestamp=time.time()))
    probed = probe_iterations(run, items=env.num_envs, iterations=iterations,
                              collocated=inline) if iterations > 1 else Profile()
    return Profile((*profile.measurements, *extra, *probed.measurements),
                   profile.switches, {**profile.metadata, **probed.metadata})
