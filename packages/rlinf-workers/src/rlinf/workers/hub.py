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

__all__ = ["is_hub_id", "resolve_model_dir"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(value: str) -> bool:
    """Whether `value` reads as ``org/name`` (and not as a path to a folder that exists)."""
    return bool(_HUB_ID.match(value)) and not Path(value).expanduser().exists()


def resolve_model_dir(value: str, *, key: str = "model.dir") -> Path:
    """The folder `value` names: itself, or the cached snapshot of the Hub id `value` (an
    error names the config `key` it came from)."""
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
