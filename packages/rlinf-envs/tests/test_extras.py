"""Optional extras: found without importing them, or refused naming the extra."""

from __future__ import annotations

import sys

import pytest

from rlinf.envs._extras import is_installed, require_installed
from rlinf.envs.errors import MissingExtraError


def test_an_installed_package_is_found_without_importing_it() -> None:
    sys.modules.pop("this", None)  # the Zen of Python prints when imported
    assert is_installed("this") and "this" not in sys.modules
    assert is_installed("json.decoder")  # its top-level package decides
    assert not is_installed("rlinf_no_such_package")


def test_a_missing_package_names_its_extra() -> None:
    require_installed("json", extra="none", feature="json")
    with pytest.raises(MissingExtraError, match="rlinf-envs\\[math\\]"):
        require_installed("rlinf_no_such_package", extra="math", feature="verification")
