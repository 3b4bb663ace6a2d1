"""The embodied flow with the policy and the actor on a CUDA GPU, simulators on CPU cores.

Skipped without a GPU. Both modes share the one GPU: Ray gives the policy-holding process
and the actor half a GPU each (`workflow.declare`: `ComponentSpec.num_gpus=0.5`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from rlinf_embodied.flow import EmbodiedFlow, fixed_plan

from .test_flow import SPEC, outcome

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA_SPEC = replace(SPEC, device="cuda")


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    import ray

    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.parametrize("mode", ["collocated", "hybrid"])
def test_policy_and_actor_on_the_gpu_train_like_the_cpu(mode: str) -> None:
    results = {}
    for name, spec in (("cpu", SPEC), ("cuda", CUDA_SPEC)):
        with EmbodiedFlow.launch(spec, fixed_plan(spec, mode)) as flow:
            results[name] = [outcome(flow.step(s)) for s in range(3)]
    for step, (cpu, gpu) in enumerate(zip(results["cpu"], results["cuda"], strict=True)):
        assert set(cpu) == set(gpu), step
        assert all(math.isfinite(value) for value in gpu.values()), (step, gpu)
    # The first rollout runs the same initial weights on both devices: its episodes agree
    # up to float differences in sampling (same seeds, same streams).
    first_cpu, first_gpu = results["cpu"][0], results["cuda"][0]
    if "episode_return" in first_cpu and "episode_return" in first_gpu:
        assert first_gpu["episode_return"] == pytest.approx(first_cpu["episode_return"],
                                                            rel=0.2)
