"""A model named as a local folder or a Hugging Face Hub id (``org/name``), resolved from the
local Hugging Face cache (``HF_HUB_CACHE``, else huggingface_hub's default under
``HF_HOME``). Nothing is downloaded here: runs must not depend on the network, and a
missing model is reported with the command that fetches it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rlinf.workers.errors import InvalidConfigError

__all__ = ["MODEL_FILES", "is_hub_id", "resolve_model_dir"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(value: str) -> bool:
    """Whether `value` reads as ``org/name`` (and not as a path to a folder that exists)."""
    return bool(_HUB_ID.match(value)) and not Path(value).expanduser().exists()


MODEL_FILES = ("config.json", "warmstart.json")
"""A model folder holds one of these: a Hugging Face model, or a warm start
(`rlinf.workers.models.warmstart`)."""


def resolve_model_dir(value: str, *, key: str = "model.dir") -> Path:
    """The model folder `value` names: itself, or the cached snapshot of the Hub id `value`;
    an `InvalidConfigError` naming the config `key` when it is missing or holds no model
    (checked now: the roles would each fail only after Ray started)."""
    folder = _folder(value, key)
    if not folder.is_dir():
        raise InvalidConfigError(key, value, "an existing folder with an HF-format model and "
                                 "tokenizer, or a Hugging Face Hub id (org/name) in the local "
                                 "cache")
    if not any((folder / name).is_file() for name in MODEL_FILES):
        raise InvalidConfigError(key, value, "a folder with config.json (a Hugging Face model "
                                 f"and tokenizer) or warmstart.json (a warm start); {folder} "
                                 "has neither")
    return folder


def _folder(value: str, key: str) -> Path:
    folder = Path(value).expanduser()
    if not is_hub_id(value):
        return folder
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE") or None
    try:
        return Path(snapshot_download(value, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError) as exc:
        where = cache or "the default Hugging Face cache"
        raise InvalidConfigError(
            key, value,
            f"a local folder, or a Hub id already in {where}; {value!r} is not there "
            f"(runs never download): fetch it with `hf download {value}` (or "
            f"`huggingface-cli download {value}`) and run again") from exc
