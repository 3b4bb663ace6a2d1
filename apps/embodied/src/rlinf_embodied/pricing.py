"""How the embodied flow runs a plan, for the library's pricing
(`rlinf.workers.training.Pricing`), and the plans a run starts from.

A fixed placement keeps the env's pipeline stage groups as the env and rollout micro-batch
(``num_envs / pipeline_stages`` envs per message) and trains on the whole rollout. A profile
(the run's own first iterations, the cache, or a dry run's probes: `EmbodiedFlow.measure`
at a few batch sizes with the env ↔ policy link's round trips) prices plans on the cluster
calibrated to the link's round trips, the devices' hand-overs and the pipelined probe, in
that order (`EmbodiedPricing.calibrated`); every iteration pays the weight sync and the
driver's control round trips beside the simulated dataflow.
"""

from __future__ import annotations

import math

from rlinf.sched import Cluster, CostModel, ExecutionPlan, Placement, Profile, Workflow
from rlinf.workers.embodied.run_profile import LINK
from rlinf.workers.flow.auto import CONTROL, WEIGHT_SYNC
from rlinf.workers.training import Pricing
from rlinf.workers.training.pricing import calibrated_link, fitted_turns, link_cluster, on_cluster
from rlinf_embodied.config import PlacementConfig, resolve_placement

__all__ = ["LINK", "TIE_TOLERANCE", "EmbodiedPricing", "cluster_for", "fixed_plan", "placement_on",
           "profile_batch_sizes"]

TIE_TOLERANCE = 0.02
"""Plans predicted within 2% of the fastest are tied and the one on fewest device slots is
chosen: profiles taken on a shared CPU box vary by more than that from run to run, and a
slot that buys nothing measurable adds a contending process (`PlannerOptions`)."""


class EmbodiedPricing(Pricing):
    """Plans of the embodied workflow priced as `EmbodiedFlow` runs them (module docstring)."""

    overheads = (WEIGHT_SYNC, CONTROL)
    tie_tolerance = TIE_TOLERANCE

    def cost_model(self, profile: Profile, cluster: Cluster) -> CostModel:
        return self.fitted(profile).fitted

    def calibrated(self, cluster: Cluster, profile: Profile) -> Cluster:
        cost, workflow = self.fitted(profile).fitted, self.priced_workflow(self.workflow)
        linked = link_cluster(cluster, workflow, profile, component=LINK, edge="env->rollout")
        turned = fitted_turns(linked, workflow, profile, cost)
        return calibrated_link(turned, workflow, profile, cost)


def cluster_for(cfg: PlacementConfig) -> Cluster:
    """The devices placements are validated against: `num_devices` CPU slots of this
    machine (no Ray needed). Embodied components are processes on core slots; with
    ``run.device=cuda`` the policy processes share the machine's GPU through Ray
    (`ComponentSpec.num_gpus` in `workflow.declare`), so a GPU is not a placement device."""
    return Cluster.discover(use_ray=False, cpu_slots=cfg.num_devices, gpus=False)


def placement_on(cfg: PlacementConfig, workflow: Workflow, cluster: Cluster) -> Placement:
    """The configured placement on `cluster`'s devices (e.g. GPUs discovered: re-validated
    there)."""
    return on_cluster(resolve_placement(cfg, components=workflow.names), cluster)


def fixed_plan(placement: Placement, workflow: Workflow, *, pipeline_stages: int,
               label: str = "") -> ExecutionPlan:
    """The unpriced plan (predicted time NaN) of a placement the config fixes: env and
    rollout exchange one stage group per message, the actor trains on the whole rollout."""
    micro = {}
    for name in workflow.names:
        batch = workflow.batch_of(name)
        in_loop = workflow.loop_of(name) is not None
        micro[name] = max(1, batch // pipeline_stages) if in_loop else batch
    granularity = {e.key: micro[e.dst] for e in workflow.edges}
    return ExecutionPlan(placement, micro, granularity, math.nan, math.nan,
                         label or placement.mode.value)


def profile_batch_sizes(num_envs: int, pipeline_stages: int) -> tuple[int, ...]:
    """Env counts to profile at: one env, a stage group and all envs. The planner may split
    the envs into groups down to one env each, so the cost curve's fixed part per call is
    measured at one env rather than extrapolated (a fit through two large sizes alone can
    put it near zero and favour groups far smaller than any measured)."""
    group = max(1, num_envs // pipeline_stages)
    return tuple(sorted({1, group, num_envs}))
