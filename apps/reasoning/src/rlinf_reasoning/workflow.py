"""The reasoning workflow, declared once (`declare`): GRPO/PPO on math.

    rollout(problems) ──groups──▶ reward ──▶ inference (old/ref log-probs) ──▶ actor.train
         ▲                                                                        │
         └──────────────────────── weight sync ◀──────────────────────────────────┘

The declaration is a `rlinf.workers.flow.MacroFlow` of the library's reasoning roles; the
runtime profiles, plans, launches and runs it in any placement. Every component and channel
keeps whole GRPO groups (``micro_batch_multiple=group_size``). The planner prices
``declare(spec).to_sched_workflow()`` (`reasoning_workflow`): the rollout is one streaming
call whose groups leave a rollout micro-batch at a time (`rollout_completion`), and each
edge carries the bytes of a response.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from rlinf.sched import (
    Component,
    Edge,
    ExecutionPlan,
    Placement,
    Workflow,
    staircase_completion,
)
from rlinf.workers import flow as rf
from rlinf.workers.reasoning import (
    ActorRole,
    InferenceRole,
    ProblemSource,
    RewardRole,
    RoleSetup,
    RolloutRole,
)
from rlinf_reasoning.spec import FlowSpec

__all__ = [
    "TYPICAL_PROMPT_TOKENS",
    "declare",
    "fixed_plan",
    "flow_components",
    "reasoning_workflow",
    "rollout_completion",
    "run_inputs",
    "streams_actor",
]

TYPICAL_PROMPT_TOKENS = 32
"""A typical short-template prompt, for the bytes an edge carries per response and the
tokens a trainer cut is priced at."""


def flow_components(spec: FlowSpec) -> tuple[str, ...]:
    """The components of the flow: rollout, reward, (inference,) actor."""
    middle = ("inference",) if spec.uses_inference else ()
    return ("rollout", "reward", *middle, "actor")


def declare(spec: FlowSpec, *, rollout_ranks: int = 1, granularity_groups: int = 1
            ) -> rf.MacroFlow:
    """The flow of `spec`; fixed plans carry `granularity_groups` groups per message, and
    `rollout_ranks` shapes the rollout's completion curve the planner prices. What a run
    feeds it goes to the launch (`run_inputs`)."""
    group, response = spec.rollout.group_size, spec.response_tokens
    items = spec.prompts_per_step * group
    setup = RoleSetup(model_factory=spec.model.model_factory(),
                      tokenizer_factory=spec.model.tokenizer_factory(),
                      seed=spec.seed, device=spec.device,
                      precision=spec.actor.precision,
                      lock_timeout=spec.timeout, io_timeout=spec.timeout,
                      lora_adapters=spec.actor.lora if spec.lora_sync_adapters else None)
    tokens = 8 * (2 * TYPICAL_PROMPT_TOKENS + 3 * response) + 4 * response  # ids, masks, log-probs
    per_item = {"reward": tokens + 4, "inference": tokens + 4 * response + 4,
                "actor": tokens + 4 * response + 4}

    def part(name: str, worker: type[rf.FlowWorker], entry: str, resource: str = "gpu",
             **kwargs: object) -> rf.ComponentSpec:
        completion = (rollout_completion(spec.prompts_per_step, rollout_ranks,
                                         spec.rollout.groups_per_micro_batch)
                      if name == "rollout" else ((1.0, 1.0),))
        # A Megatron trainer needs whole model-parallel groups of devices.
        cut = spec.actor_model_parallel if name == "actor" else 1
        return rf.ComponentSpec(
            Component(name, resource=resource, batch=items, micro_batch_multiple=group,
                      streaming=name == "rollout", completion=completion,
                      device_multiple=cut, min_devices=cut),
            worker, entry=entry, init_kwargs={"setup": setup, **kwargs})

    components = [
        part("rollout", RolloutRole, "rollout_step", config=spec.rollout, engine=spec.engine,
             engine_options=dict(spec.engine_options), tools=spec.tools),
        part("reward", RewardRole, "reward_step", resource="cpu", config=spec.reward),
    ]
    if spec.uses_inference:
        components.append(part(
            "inference", InferenceRole, "inference_step", temperature=spec.actor.temperature,
            micro_batch_size=spec.actor.micro_batch_size, recompute=spec.recompute_logprobs,
            reference=spec.actor.kl_coef > 0, padding_free=spec.actor.padding_free,
            # Megatron's layers bring their own (sdpa) attention: the model's is closest.
            attention="model" if spec.megatron is not None else spec.actor.attention))
    components.append(dataclasses.replace(
        part("actor", ActorRole, "train_step", config=spec.actor, bucket_bytes=spec.bucket_bytes,
             stream=spec.actor_streams, megatron=spec.megatron), setup="build",
        distributed=True))
    channels = tuple(rf.ChannelSpec(Edge(a.name, b.name, bytes_per_item=float(per_item[b.name])),
                                    granularity=granularity_groups * group)
                     for a, b in itertools.pairwise(components))
    # The rollout receives last: sharing the actor's devices, it keeps them for generation.
    receivers = ("inference", "rollout") if spec.recompute_logprobs else ("rollout",)
    return rf.MacroFlow(tuple(components), channels,
                        weight_syncs=(rf.WeightSyncSpec("actor", receivers, spec.weight_sync),),
                        global_batch=items, device=spec.device,
                        name=f"{spec.actor.algorithm}-math", policy_lag=spec.actor.policy_lag,
                        host_allocator=spec.host_allocator)


def run_inputs(problems: ProblemSource, *, engine_model_path: str | None = None
               ) -> dict[str, dict[str, object]]:
    """What a run feeds the flow at launch: the rollout's prompt source (drawn from in its
    process) and the folder an engine such as vLLM loads."""
    return {"rollout": {"problems": problems, "model_path": engine_model_path}}


def reasoning_workflow(spec: FlowSpec, *, rollout_ranks: int = 1) -> Workflow:
    """The flow as the planner sees it (items are responses)."""
    return declare(spec, rollout_ranks=rollout_ranks).to_sched_workflow()


def rollout_completion(prompts: int, ranks: int, groups_per_micro_batch: int
                       ) -> tuple[tuple[float, float], ...]:
    """The completion of a rollout whose ranks each generate their share of `prompts` in
    micro-batches of `groups_per_micro_batch` prompts (`rlinf.sched.staircase_completion`)."""
    share = math.ceil(prompts / max(1, ranks))
    return staircase_completion(max(1, math.ceil(share / groups_per_micro_batch)))


def streams_actor(spec: FlowSpec, placement: Placement) -> bool:
    """Whether the actor trains micro-batch by micro-batch as groups arrive
    (`rlinf.workers.reasoning.ActorRole.train_step`): only where no actor device is also a
    rollout device, since a device the rollout shares is held by it for its whole
    generation."""
    actor = placement.components["actor"]
    shared = set(actor.devices) & set(placement.devices_of("rollout"))
    return (spec.actor_streams and not shared
            and spec.actor.can_stream(distributed=actor.num_procs > 1))


def fixed_plan(spec: FlowSpec, placement: str, *, num_devices: int,
               granularity_groups: int = 1) -> ExecutionPlan:
    """An unpriced `ExecutionPlan` for a placement written by hand (e.g. "rollout: 0,
    reward,inference,actor: 1"): edges carry `granularity_groups` groups per message."""
    flow = declare(spec, granularity_groups=granularity_groups)
    plan = flow.fixed_plan(placement, num_devices=num_devices)
    return dataclasses.replace(plan, predicted_time=0.0, utilisation=0.0)
