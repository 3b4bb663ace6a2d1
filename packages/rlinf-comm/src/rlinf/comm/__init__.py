"""rlinf.comm — adaptive communication for RL workloads.

Zero-copy batches over shared memory, TCP, CUDA IPC and NCCL; point-to-point send/recv;
named multi-producer multi-consumer channels; rendezvous with or without Ray.
"""

from rlinf.comm._internal.channel import Channel
from rlinf.comm._internal.endpoint import Endpoint, EndpointConfig
from rlinf.comm._internal.ray_store import RayStore
from rlinf.comm._internal.ring import RingClosedError, ShmRing
from rlinf.comm._internal.store import Store, TCPStore, TCPStoreServer
from rlinf.comm._internal.wire import TOKEN_ENV, default_token, new_token, token_env_value
from rlinf.comm._internal.work import Work
from rlinf.comm.batch import Batch
from rlinf.comm.errors import (
    AuthenticationError,
    ChannelClosedError,
    CodecError,
    CommError,
    CommTimeoutError,
    InvalidArgumentError,
    MissingExtraError,
    PeerDiedError,
    TransportError,
)
from rlinf.comm.leaks import live_segments, orphaned_segments
from rlinf.comm.version import __version__

__all__ = [
    "TOKEN_ENV",
    "AuthenticationError",
    "Batch",
    "Channel",
    "ChannelClosedError",
    "CodecError",
    "CommError",
    "CommTimeoutError",
    "Endpoint",
    "EndpointConfig",
    "InvalidArgumentError",
    "MissingExtraError",
    "PeerDiedError",
    "RayStore",
    "RingClosedError",
    "ShmRing",
    "Store",
    "TCPStore",
    "TCPStoreServer",
    "TransportError",
    "Work",
    "__version__",
    "default_token",
    "live_segments",
    "new_token",
    "orphaned_segments",
    "token_env_value",
]
