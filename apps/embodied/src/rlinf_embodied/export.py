"""``rlinf-embodied export RUN_DIR [--step N] --out DIR``: a checkpoint's policy as a file a
user loads without the app's run: ``policy.pt`` holds the network's shape
(`rlinf.workers.models.policy.PolicyConfig`) and its state dict, and `load_policy` rebuilds
the `ActorCritic` from it (``act(obs, deterministic=True)`` is the evaluation policy).

The checkpoint's actor state (model, optimizer, RNGs) is the run's record; the export keeps
the model only. The network's shape comes from the task's spaces, so the export builds one
simulator of the run's task, as the run did. VLA policies are not exported here: their
weights are a pretrained model's, saved with the processor by its own library.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from rlinf.workers.errors import ConfigError
from rlinf.workers.models.policy import ActorCritic, PolicyConfig
from rlinf.workers.schema import build, nested
from rlinf.workers.training.folder import EXPORT_FILE, checkpoint_for_export, write_export_record
from rlinf_embodied.config import AppConfig

__all__ = ["EXPORT_FILE", "POLICY_FILE", "POLICY_FORMAT", "export_policy", "load_policy"]

POLICY_FILE = "policy.pt"
"""The exported network: ``{"format", "policy_config", "state_dict"}``."""
POLICY_FORMAT = "rlinf-embodied-policy/1"


def export_policy(run_dir: Path, out: Path, *, step: int | None = None) -> Path:
    """Write the policy of `run_dir`'s checkpoint at `step` (None: the latest) to `out`;
    returns the policy file. ConfigError saying what is missing otherwise."""
    from rlinf_embodied.spec import build_spec

    found, folder, meta = checkpoint_for_export(run_dir, step)
    cfg = build(AppConfig, nested(meta["config"]))
    policy = build_spec(cfg).policy
    if not isinstance(policy, PolicyConfig):
        raise ConfigError(f"{run_dir} trained a {cfg.policy.kind} policy; export writes MLP "
                          "and CNN policies (a VLA's weights are its pretrained model's)")
    actor = torch.load(folder / "actor.pt", weights_only=False)
    model = ActorCritic(policy)
    model.load_state_dict(actor["actor"]["model"])
    out.mkdir(parents=True, exist_ok=True)
    path = out / POLICY_FILE
    torch.save({"format": POLICY_FORMAT, "policy_config": dataclasses.asdict(policy),
                "state_dict": model.state_dict()}, path)
    write_export_record(out, run_dir=run_dir, step=found, config=nested(meta["config"]))
    return path


def load_policy(path: str | Path) -> ActorCritic:
    """The `ActorCritic` an export wrote (`path`: the folder or its ``policy.pt``), in eval
    mode."""
    file = Path(path)
    file = file / POLICY_FILE if file.is_dir() else file
    saved: dict[str, Any] = torch.load(file, weights_only=True)
    if saved.get("format") != POLICY_FORMAT:
        raise ConfigError(f"{file} holds format {saved.get('format')!r}, expected "
                          f"{POLICY_FORMAT!r} (written by rlinf-embodied export)")
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                              for k, v in saved["policy_config"].items()}
    model = ActorCritic(PolicyConfig(**fields))
    model.load_state_dict(saved["state_dict"])
    return model.eval()
