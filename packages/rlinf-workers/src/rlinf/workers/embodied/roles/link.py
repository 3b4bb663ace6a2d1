"""`RoleLink`: the two rlinf.comm channels between an env role and a policy role.

Each side creates the channel it reads from (its *inbound* channel), so a `get` is served by
its own process and a `put` costs one hop to the consumer; then it connects to the peer's.
Channel names are registered in a `RayStore` (a named Ray actor), so the roles find each
other wherever Ray placed them. Every process needs the run's shared token in
``RLINF_COMM_TOKEN`` (the flow passes it in the launch environment).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf.comm import Channel, Endpoint, RayStore
from rlinf.workers.errors import ConfigError

__all__ = ["RoleLink", "open_channels"]


@dataclass(frozen=True)
class RoleLink:
    """Names of the channels between one env role and one policy role."""

    observations: str
    """Channel of observation micro-batches (env → policy; owned by the policy role)."""
    actions: str
    """Channel of replies: actions, log-probs, values (policy → env; owned by the env role)."""
    store: str = "rlinf-comm-store"
    """Name of the `RayStore` actor where the channels register."""
    timeout: float = 120.0
    """Seconds a rollout waits for one micro-batch before it fails (a dead or stuck peer)."""

    def __post_init__(self) -> None:
        if not self.observations or not self.actions or self.observations == self.actions:
            raise ConfigError(f"a role link needs two distinct channel names, got "
                              f"{self.observations!r} and {self.actions!r}")
        if self.timeout <= 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {self.timeout}")


def open_channels(inbound: str, outbound: str, *, store: str, timeout: float
                  ) -> tuple[Channel, Channel]:
    """Create `inbound` here, then connect to `outbound` (waiting up to `timeout` for the peer
    to create it). Returns ``(inbound, outbound)``."""
    ray_store = RayStore(store)
    endpoint = Endpoint.current(store=ray_store)
    mine = Channel.create(inbound, store=ray_store, endpoint=endpoint)
    try:
        theirs = Channel.connect(outbound, store=ray_store, endpoint=endpoint, timeout=timeout)
    except BaseException:
        mine.disconnect()
        raise
    return mine, theirs
