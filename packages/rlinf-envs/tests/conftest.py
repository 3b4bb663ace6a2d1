"""Shared fixtures of the rlinf-envs tests."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture
def data_dir() -> Path:
    """Folder of the small sample datasets shipped with the tests."""
    return DATA
