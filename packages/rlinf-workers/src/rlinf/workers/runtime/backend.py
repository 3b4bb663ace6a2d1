"""Where a run's ranks live: Ray actors, or processes of this machine (no Ray at all).

A run on one machine starts no Ray: its ranks are local processes
(`rlinf.workers.runtime.local`), which start faster and cost less CPU. Ray is used when
the run needs a cluster or the user asks for it: this process is connected to Ray already
(``ray.init`` before the run), ``RAY_ADDRESS`` (or an ``address`` option) names a cluster
to join, or ``RLINF_BACKEND=ray``. ``RLINF_BACKEND=local`` refuses a cluster address
rather than silently running on one machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from rlinf.workers.errors import ConfigError

__all__ = ["BACKEND_ENV", "start_local_early", "start_runtime", "wants_ray"]

BACKEND_ENV = "RLINF_BACKEND"
"""``auto`` (default), ``ray`` or ``local``."""

_CHOICES = ("auto", "ray", "local")


def wants_ray(options: Mapping[str, Any] | None = None) -> bool:
    """Whether a run with `ensure_ray`'s `options` runs its ranks on Ray (see the module
    docstring); a bad `BACKEND_ENV` or a cluster address with ``local`` is a `ConfigError`.
    Never imports Ray: a process that has not imported it is not connected to it."""
    from rlinf.workers.runtime.lazy_ray import connected as ray_connected

    connected = ray_connected()
    choice = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ConfigError(f"{BACKEND_ENV}={choice!r}: use one of {list(_CHOICES)} (auto: "
                          "Ray only for a cluster, local processes on one machine)")
    address = (options or {}).get("address") or os.environ.get("RAY_ADDRESS")
    if choice == "local":
        if address:
            raise ConfigError(f"{BACKEND_ENV}=local runs on this machine only, but a Ray "
                              f"cluster is named ({address!r}): unset RAY_ADDRESS or use "
                              f"{BACKEND_ENV}=ray")
        return connected
    return choice == "ray" or bool(address) or connected


def start_local_early(preload: Iterable[str] = ()) -> bool:
    """Start the local fork server now, importing `preload` (torch, the roles: seconds of
    CPU) beside whatever this process does next (composing its config, its own imports),
    when nothing asks for Ray yet (`wants_ray` without options: an ``address`` a config
    names later still gets Ray, and this server then idles until exit, when it is
    stopped). Returns whether it started here."""
    try:
        if wants_ray():
            return False
    except ConfigError:
        return False  # said again, as the run's own error, when the run starts its backend
    from rlinf.workers.runtime.allocator import DEFAULT_ALLOCATOR, allocator_env
    from rlinf.workers.runtime.local import start_server

    return start_server(preload, env=allocator_env(DEFAULT_ALLOCATOR))


def start_runtime(preload: Iterable[str] = (), **options: Any) -> bool:
    """Start what the run's ranks need: Ray (`ensure_ray` with `options`) when `wants_ray`,
    else the local fork server, importing `preload` ahead of the ranks. Returns whether Ray
    was started here (the caller then stops it)."""
    from rlinf.workers.runtime.allocator import DEFAULT_ALLOCATOR, allocator_env

    if wants_ray(options):
        from rlinf.workers.runtime.ray_session import ensure_ray

        return ensure_ray(**options)
    from rlinf.workers.runtime.local import start_server

    start_server(preload, env=allocator_env(DEFAULT_ALLOCATOR))
    return False
