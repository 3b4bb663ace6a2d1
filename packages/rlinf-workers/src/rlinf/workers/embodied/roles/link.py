"""`RoleLink`: how an env role and a policy role exchange micro-batches through rlinf.comm.

Two transports, one protocol (the env worker's sink/source):

- ``"p2p"`` (default): each role opens an `Endpoint` named after its inbound stream and
  sends straight to the peer's (`PeerLink`): one message per micro-batch.
- ``"channel"``: each side creates the `Channel` it reads from (its *inbound* channel), so
  a `get` is served by its own process and a `put` costs one hop to the consumer; then it
  connects to the peer's. Two owner round trips per item (put, get).

Names are registered in a `RayStore` (a named Ray actor), so the roles find each other
wherever Ray placed them. Every process needs the run's shared token in
``RLINF_COMM_TOKEN`` (the flow passes it in the launch environment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlinf.comm import Channel, Endpoint, RayStore
from rlinf.workers.embodied.roles.peer import PeerLink
from rlinf.workers.env.link import ActionSource, ObsSink
from rlinf.workers.errors import ConfigError

__all__ = ["LinkEnds", "RoleLink", "open_channels", "open_link"]


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
    transport: Literal["p2p", "channel"] = "p2p"
    """Point-to-point endpoint messages, or named channels (module docstring)."""

    def __post_init__(self) -> None:
        if self.transport not in ("p2p", "channel"):
            raise ConfigError(f"transport must be 'p2p' or 'channel', got {self.transport!r}")
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


@dataclass
class LinkEnds:
    """One role's side of an open link: where it reads, where it writes, what to close."""

    inbound: ActionSource
    """Where this role receives (its own channel or endpoint)."""
    outbound: ObsSink
    """Where this role sends (the peer's channel or endpoint)."""
    channels: tuple[Channel, ...] = ()
    """Channels to disconnect on shutdown."""
    endpoint: Endpoint | None = None
    """Endpoint to close on shutdown."""

    def close(self) -> None:
        """Disconnect channels and close the endpoint."""
        for channel in self.channels:
            channel.disconnect()
        if self.endpoint is not None:
            self.endpoint.close()


def open_link(link: RoleLink, *, inbound: str, outbound: str) -> LinkEnds:
    """Open this role's side of `link`: it reads `inbound` and writes `outbound` (each one
    of ``link.observations`` / ``link.actions``)."""
    if link.transport == "channel":
        mine, theirs = open_channels(inbound, outbound, store=link.store, timeout=link.timeout)
        return LinkEnds(inbound=mine, outbound=theirs, channels=(mine, theirs))
    endpoint = Endpoint(inbound, store=RayStore(link.store)).make_current()
    peer = PeerLink(endpoint, outbound, timeout=link.timeout)
    return LinkEnds(inbound=peer, outbound=peer, endpoint=endpoint)
