"""GRPO whose reward adds a reward model's score, the model served by a component of our own.

    rollout ──▶ reward (rules) ──▶ judge (reward model) ──▶ actor (GRPO) ──weights──▶ rollout

`Judge`, written here, adds ``weight x tanh(score)`` of a scorer LM (a causal LM body, a
value head on the last token) to each rule reward. It does what any component does: an
entry method the runtime calls once per iteration with its channels; this rank's groups
read a message at a time (`receive_shard`); its devices held only while it computes
(`turn`: collocated components take turns); each group passed on under the key of the
consumer rank that owns it; `onload`/`offload` for the device lock. Only the placement
changes: ``--placement auto``, or a spec such as ``"rollout: 0, reward,judge,actor: 1"``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rlinf.envs.math import GeneratorConfig, ProblemGenerator
from rlinf.sched import Cluster, Component, Edge
from rlinf.workers import flow as rf
from rlinf.workers import reasoning as rr
from rlinf.workers.actor import ActorConfig
from rlinf.workers.models import TinyLMConfig, build_tiny_model
from rlinf.workers.rollout import RolloutBatch, RolloutGeneratorConfig, SamplingConfig
from rlinf.workers.rollout.offload import state_bytes
from rlinf.workers.runtime import WorkerContext


class Judge(rr.ReasoningRole):
    """Adds `weight` x a reward model's score (in [-1, 1]) to every response's reward."""

    def __init__(self, context: WorkerContext, *, setup: rr.RoleSetup, weight: float) -> None:
        super().__init__(context, setup=setup)
        body, _ = setup.model_factory()  # a reward model's body: any causal LM
        torch.manual_seed(setup.seed + 1)
        head = torch.nn.Linear(body.config.hidden_size, 1)
        self.model, self.weight = torch.nn.ModuleDict({"body": body, "head": head}), weight
        self.offload()  # components start offloaded: their first turn onloads them

    @torch.no_grad()
    def score(self, group: RolloutBatch) -> torch.Tensor:  # one per row, at its last token
        ids = torch.cat([group.prompt_ids, group.response_ids], 1).to(self.device)
        mask = torch.cat([group.prompt_mask, group.response_mask], 1).to(self.device)
        hidden = self.model["body"](input_ids=ids, attention_mask=mask,
                                    output_hidden_states=True).hidden_states[-1]
        last = (mask * torch.arange(mask.shape[1], device=self.device)).argmax(1)
        return torch.tanh(self.model["head"](hidden[torch.arange(len(ids)), last])[:, 0]).cpu()

    def judge_step(self, ctx: rf.StepContext, *, input_channel: rf.FlowChannel,
                   output_channel: rf.FlowChannel) -> dict[str, float]:  # the entry
        onward = output_channel.units(ctx.items[output_channel.dst])  # groups downstream
        out, total, rows = self.channel(output_channel), 0.0, 0
        for message in self.receive_shard(ctx, input_channel):  # a message at a time
            with self.turn("judge", step=ctx.step, groups=len(message)):  # devices held
                for index, group in message:
                    scores = self.score(group)
                    assert group.rewards is not None  # set by the reward component
                    judged = group.replace(rewards=group.rewards + self.weight * scores)
                    out.put(rr.pack_group(judged, index=index, step=ctx.step),
                            weight=group.num_rows, key=output_channel.key_of(index, onward))
                    total, rows = total + float(scores.sum()), rows + group.num_rows
        return {"mean_score": total / max(rows, 1)}

    def resident_memory_bytes(self) -> int | None:  # lets the lock keep it beside others
        return state_bytes(self.model)

    def onload(self) -> None:  # the device lock calls these at a switch
        self.model.to(self.device)

    def offload(self) -> None:
        self.model.to("cpu")


@dataclass(frozen=True)
class Config:
    placement: str = "rollout,reward,judge,actor: 0"  # a spec (rlinf.sched), or 'auto'
    iterations: int = 2
    prompts: int = 4
    group_size: int = 4
    max_new_tokens: int = 6
    judge_weight: float = 0.1  # the reward model's share beside the rule reward (0 or 1)
    cpu_slots: int | None = None  # devices of this machine (None: one per core)
    seed: int = 0
    timeout: float = 300.0  # seconds any wait may take before the run fails
    model: TinyLMConfig = field(default_factory=lambda: TinyLMConfig(
        hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128))
    actor: ActorConfig = field(default_factory=lambda: ActorConfig(
        algorithm="grpo", parallelism="ddp", lr=1e-3, micro_batch_size=16))


def declare(cfg: Config) -> rf.MacroFlow:  # four components, three channels, a weight sync
    items = cfg.prompts * cfg.group_size
    setup = rr.RoleSetup(
        model_factory=functools.partial(build_tiny_model, cfg.model, seed=cfg.seed),
        seed=cfg.seed, lock_timeout=cfg.timeout, io_timeout=cfg.timeout)
    rollout = RolloutGeneratorConfig(group_size=cfg.group_size, groups_per_micro_batch=2,
                                  sampling=SamplingConfig(max_new_tokens=cfg.max_new_tokens))

    def part(name: str, worker: type[Any], entry: str, **kwargs: Any) -> rf.ComponentSpec:
        return rf.ComponentSpec(Component(name, batch=items, micro_batch_multiple=cfg.group_size,
                                          resource="cpu" if name == "reward" else "gpu",
                                          streaming=name == "rollout"),
                                worker, entry=entry, init_kwargs={"setup": setup, **kwargs})

    components = (part("rollout", rr.RolloutRole, "rollout_step", config=rollout),
                  part("reward", rr.RewardRole, "reward_step"),
                  part("judge", Judge, "judge_step", weight=cfg.judge_weight),  # ours
                  replace(part("actor", rr.ActorRole, "train_step", config=cfg.actor),
                          setup="build", distributed=True))
    channels = tuple(rf.ChannelSpec(Edge(a.name, b.name),  # its bytes: measured by profiling
                                    granularity=cfg.group_size)  # a group per message
                     for a, b in itertools.pairwise(components))
    return rf.MacroFlow(components, channels, global_batch=items, name="reward-model-math",
                        weight_syncs=(rf.WeightSyncSpec("actor", ("rollout",)),))


def main(cfg: Config) -> dict[str, Any]:  # launch, train, close; a summary
    flow, cluster = declare(cfg), Cluster.discover(cpu_slots=cfg.cpu_slots)
    problems = ProblemGenerator(GeneratorConfig.for_level(1, seed=cfg.seed)).batch
    inputs = {"rollout": {"problems": problems}}  # what this run feeds the flow's rollout
    if cfg.placement == "auto":
        run, report = rf.launch_auto(flow, cluster, batch_sizes=(8, 16), timeout=cfg.timeout,
                                     inputs=inputs)
    else:
        run, report = rf.FlowRun.launch(flow, flow.fixed_plan(
            cfg.placement, num_devices=cluster.num_devices), cluster=cluster,
            timeout=cfg.timeout, inputs=inputs), None
    with run:
        records = [run.step(k) for k in range(cfg.iterations)]
    keys = ("reward/mean_reward", "judge/mean_score", "actor/policy_loss")
    summary: dict[str, Any] = {"placement": run.plan.spec, "mode": run.plan.mode.value,
                               "lock_holds": [r.lock_holds for r in records],
                               **{k: [r.metrics[k] for r in records] for k in keys}}
    summary.update(report.compare(records[1:] or records) if report else {})  # auto: predicted
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, kind in (("--placement", str), ("--iterations", int), ("--cpu-slots", int)):
        parser.add_argument(flag, type=kind, default=getattr(Config, flag[2:].replace("-", "_")))
    main(Config(**vars(parser.parse_args())))
