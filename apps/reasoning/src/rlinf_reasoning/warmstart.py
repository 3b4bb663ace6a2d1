"""The warm-start checkpoints the app ships: a tiny Qwen2-style model partly trained on sums
(`WARMSTART_DIR`), and the same model trained to call the calculator (`TOOLS_WARMSTART_DIR`).

``scripts/train_warmstart.py`` writes them; `rlinf.workers.models.warmstart` reads any such
folder. The functions here default to the shipped one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlinf.workers.models import warmstart as folder
from rlinf.workers.models.warmstart import METADATA_FILE, WEIGHTS_FILE, WarmstartError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

    from rlinf.envs.math import GeneratorConfig

__all__ = ["METADATA_FILE", "TOOLS_WARMSTART_DIR", "WARMSTART_DIR", "WEIGHTS_FILE",
           "WarmstartError", "load_warmstart", "read_metadata", "warmstart_task"]

WARMSTART_DIR: Path = Path(__file__).resolve().parent / "assets" / "warmstart"
"""Folder of the shipped checkpoint (inside the installed package)."""
TOOLS_WARMSTART_DIR: Path = WARMSTART_DIR.parent / "warmstart_tools"
"""Folder of the shipped tool-calling checkpoint (``task=math_tools``): the same model
trained to call the calculator in the tag format."""


def load_warmstart(device: str | torch.device = "cpu", *, path: Path = WARMSTART_DIR
                   ) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The shipped model (in eval mode, on `device`) and its tokenizer."""
    return folder.load_warmstart(path, device)


def read_metadata(path: Path = WARMSTART_DIR) -> dict[str, Any]:
    """The contents of ``warmstart.json`` in `path`."""
    return folder.read_metadata(path)


def warmstart_task(path: Path = WARMSTART_DIR) -> GeneratorConfig:
    """The generator config of the task the checkpoint was trained on (seed included)."""
    return folder.warmstart_task(path)
