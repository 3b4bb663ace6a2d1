"""`FlowChannel`: one edge's channel as its two components receive it.

A flow creates one `rlinf.comm.Channel` per declared edge, owned by rank 0 of the consuming
component's group (`FlowWorker.create_channel`): the driver never holds a channel, so no put,
get or release goes through it. Components get a `FlowChannel` — a small picklable
description (name, rendezvous store, who consumes it and how) — as ``input_channel=`` /
``output_channel=`` of their entry method, and open it in their own process
(`FlowWorker.channel`).

Items of an iteration are numbered ``0..total-1`` in *units* (a unit is what one message
carries at least: a group of `unit` responses for reasoning). Which consumer rank gets unit
``i`` is a pure function of ``i`` (`Sharding`), so every consumer knows how many units to
expect, keys address ranks (``"r0"``, ``"r1"``, …), and results do not depend on timing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from rlinf.workers.errors import ConfigError

__all__ = ["ChannelTransport", "FlowChannel", "Sharding", "paired_ranks", "rank_key"]

ChannelTransport = Literal["channel", "p2p"]
"""How an edge's messages travel: an `rlinf.comm.Channel` owned by the consumer's rank 0
(any rank counts, keys per consumer rank), or ``p2p`` messages straight between the two
ends' endpoints (`rlinf.workers.flow.peer.PeerChannel`, for latency-bound exchanges such as an
env ↔ policy loop; where both ends have several ranks, one end's count divides the
other's and ranks pair as `paired_ranks` says)."""

Sharding = Literal["round_robin", "contiguous"]
"""How a consumer's ranks split an iteration's units: ``round_robin`` (unit i to rank
i % R) or ``contiguous`` (``torch.tensor_split``'s rule: rank r gets one contiguous shard,
the first ranks one more) — a data-parallel trainer wants the latter."""


def rank_key(rank: int) -> str:
    """Channel key of consumer `rank`."""
    return f"r{rank}"


def paired_ranks(rank: int, *, mine: int, theirs: int) -> tuple[int, ...]:
    """The ranks of the other end a rank talks to over a p2p edge whose ends have `mine`
    and `theirs` ranks (one count divides the other): rank r of the larger end pairs with
    rank ``r % smaller`` of the smaller one, which so serves ``larger / smaller`` ranks (a
    policy rank batching several env ranks)."""
    if min(mine, theirs) < 1 or max(mine, theirs) % min(mine, theirs):
        raise ConfigError(f"a p2p edge pairs ranks only where one end's count divides the "
                          f"other's, got {mine} and {theirs}")
    if not 0 <= rank < mine:
        raise ConfigError(f"rank {rank} outside [0, {mine})")
    if mine >= theirs:
        return (rank % theirs,)
    return tuple(range(rank, theirs, mine))


@dataclass(frozen=True)
class FlowChannel:
    """The channel of edge ``src -> dst`` (see the module docstring)."""

    src: str
    """Producing component."""
    dst: str
    """Consuming component (rank 0 of its group owns the channel)."""
    name: str
    """The `rlinf.comm.Channel` name."""
    store: str
    """Where the run's channels are found (`store_name`): ``run@host:port``, the driver's
    `rlinf.comm.TCPStore`, or a `rlinf.comm.RayStore`'s name."""
    consumer_ranks: int
    """Ranks of the consuming group."""
    producer_ranks: int = 1
    """Ranks of the producing group."""
    sharding: Sharding = "round_robin"
    """How the consumer's ranks split the units (the consumer's `FlowWorker.input_sharding`)."""
    unit: int = 1
    """Items per unit (responses per group)."""
    items_per_message: int = 1
    """The plan's granularity of this edge: items the consumer takes per message."""
    transport: ChannelTransport = "channel"
    """How messages travel (`ChannelTransport`)."""

    def __post_init__(self) -> None:
        if min(self.consumer_ranks, self.producer_ranks, self.unit, self.items_per_message) < 1:
            raise ConfigError(f"channel {self.edge}: consumer_ranks, producer_ranks, unit and "
                              f"items_per_message must be >= 1, got {self.consumer_ranks}, "
                              f"{self.producer_ranks}, {self.unit}, {self.items_per_message}")
        if self.transport not in get_args(ChannelTransport):
            raise ConfigError(f"channel {self.edge}: transport must be one of "
                              f"{list(get_args(ChannelTransport))}, got {self.transport!r}")
        if self.sharding not in ("round_robin", "contiguous"):
            raise ConfigError(f"channel {self.edge}: sharding must be 'round_robin' or "
                              f"'contiguous', got {self.sharding!r}")

    @property
    def edge(self) -> str:
        """``"src->dst"``, the key of the edge in plans and workflows."""
        return f"{self.src}->{self.dst}"

    def peers(self, role: str, rank: int) -> tuple[int, ...]:
        """The ranks of the other end that `role`'s `rank` exchanges messages with over this
        p2p edge (`paired_ranks`)."""
        if role not in (self.src, self.dst):
            raise ConfigError(f"{role!r} is not an end of edge {self.edge}")
        mine, theirs = ((self.producer_ranks, self.consumer_ranks) if role == self.src
                        else (self.consumer_ranks, self.producer_ranks))
        return paired_ranks(rank, mine=mine, theirs=theirs)

    @property
    def units_per_message(self) -> int:
        """Units the consumer takes per message (at least one)."""
        return max(1, self.items_per_message // self.unit)

    def units(self, items: int) -> int:
        """Units in an iteration of `items` items (`items` must be a multiple of `unit`)."""
        if items < self.unit or items % self.unit:
            raise ConfigError(f"channel {self.edge} carries units of {self.unit} items, but "
                              f"the iteration has {items}: use a multiple of {self.unit}")
        return items // self.unit

    def check_shards(self, items: int) -> None:
        """Refuse an iteration of `items` items that leaves a consumer rank without a unit (a
        data-parallel trainer rank with nothing to train on would stall its peers)."""
        units = self.units(items)
        if units < self.consumer_ranks:
            raise ConfigError(f"channel {self.edge}: {items} items are {units} units of "
                              f"{self.unit}, too few for {self.consumer_ranks} {self.dst!r} "
                              f"ranks: give {self.dst!r} at most {units} devices or the "
                              "iteration more items")

    def indices(self, rank: int, total: int) -> range:
        """The units consumer `rank` receives out of `total`, in index order."""
        if not 0 <= rank < self.consumer_ranks:
            raise ConfigError(f"channel {self.edge}: rank {rank} outside "
                              f"[0, {self.consumer_ranks})")
        if self.sharding == "round_robin":
            return range(rank, total, self.consumer_ranks)
        base, extra = divmod(total, self.consumer_ranks)
        start = rank * base + min(rank, extra)
        return range(start, start + base + (1 if rank < extra else 0))

    def rank_of(self, index: int, total: int) -> int:
        """The consumer rank that receives unit `index` of `total`."""
        if not 0 <= index < total:
            raise ConfigError(f"channel {self.edge}: unit {index} outside [0, {total})")
        if self.sharding == "round_robin":
            return index % self.consumer_ranks
        base, extra = divmod(total, self.consumer_ranks)
        cut = extra * (base + 1)  # the first `extra` ranks hold base + 1 units
        return index // (base + 1) if index < cut else extra + (index - cut) // max(base, 1)

    def key_of(self, index: int, total: int) -> str:
        """The channel key unit `index` of `total` is put under."""
        return rank_key(self.rank_of(index, total))


def store_name(run: str, address: str) -> str:
    """`FlowChannel.store` of a run named `run` whose store serves at `address`."""
    return f"{run}@{address}"


def parse_store(store: str) -> tuple[str, str | None]:
    """``(run name, TCPStore address)`` of a `FlowChannel.store`; the address is None for a
    `rlinf.comm.RayStore` name."""
    run, at, address = store.rpartition("@")
    return (run, address) if at else (store, None)
