"""A model named by folder or Hub id: resolved locally, never downloaded, refused early with
the key it came from when it holds no model."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlinf.workers.errors import InvalidConfigError
from rlinf.workers.hub import is_hub_id, resolve_model_dir


def test_a_folder_with_a_model_resolves_to_itself(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_dir(str(tmp_path)) == tmp_path
    (tmp_path / "config.json").unlink()
    (tmp_path / "warmstart.json").write_text("{}")
    assert resolve_model_dir(str(tmp_path)) == tmp_path


def test_a_missing_or_empty_folder_is_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError, match=r"'policy\.dir'.*an existing folder"):
        resolve_model_dir(str(tmp_path / "nowhere"), key="policy.dir")
    with pytest.raises(InvalidConfigError, match="has neither"):
        resolve_model_dir(str(tmp_path))


def test_a_hub_id_not_in_the_cache_says_how_to_fetch_it(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert is_hub_id("acme/tiny") and not is_hub_id(str(tmp_path))
    with pytest.raises(InvalidConfigError, match="hf download acme/tiny"):
        resolve_model_dir("acme/tiny")
