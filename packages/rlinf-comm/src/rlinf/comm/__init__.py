"""rlinf.comm — adaptive communication for RL workloads.

Zero-copy batches over shared memory, TCP, CUDA IPC and NCCL; point-to-point send/recv;
named multi-producer multi-consumer channels; rendezvous with or without Ray.
"""

from rlinf.comm.batch import Batch
from rlinf.comm.errors import (
    AuthenticationError,
    ChannelClosedError,
    CodecError,
    CommError,
    CommTimeoutError,
    MissingExtraError,
    PeerDiedError,
    TransportError,
)
from rlinf.comm.version import __version__

__all__ = [
    "AuthenticationError",
    "Batch",
    "ChannelClosedError",
    "CodecError",
    "CommError",
    "CommTimeoutError",
    "MissingExtraError",
    "PeerDiedError",
    "TransportError",
    "__version__",
]
