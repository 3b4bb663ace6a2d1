"""Weight sync actor → rollout, bucketed, over the transport the placement implies.

- same process: `sync_in_process` hands the buckets over;
- same node, CPU: `ShmWeightSender` / `ShmWeightReceiver` (POSIX shared memory);
- same GPU (collocated): `CudaIpcWeightSender` / `CudaIpcWeightReceiver`;
- different devices or nodes (disaggregated): `CollectiveWeightGroup` (NCCL; gloo on CPU).

`choose_transport` maps a placement to one of them.
"""

from rlinf.workers.weight_sync.buckets import Bucket, iter_buckets, tensor_bytes
from rlinf.workers.weight_sync.collective import CollectiveWeightGroup
from rlinf.workers.weight_sync.cuda_ipc import (
    CudaIpcBucketHandle,
    CudaIpcWeightReceiver,
    CudaIpcWeightSender,
)
from rlinf.workers.weight_sync.flat import TensorMeta, flatten_bucket, plan_layout, unflatten_bucket
from rlinf.workers.weight_sync.inprocess import WeightTarget, sync_in_process
from rlinf.workers.weight_sync.shm import ShmBucketHandle, ShmWeightReceiver, ShmWeightSender
from rlinf.workers.weight_sync.transport import Transport, choose_transport

__all__ = [
    "Bucket",
    "CollectiveWeightGroup",
    "CudaIpcBucketHandle",
    "CudaIpcWeightReceiver",
    "CudaIpcWeightSender",
    "ShmBucketHandle",
    "ShmWeightReceiver",
    "ShmWeightSender",
    "TensorMeta",
    "Transport",
    "WeightTarget",
    "choose_transport",
    "flatten_bucket",
    "iter_buckets",
    "plan_layout",
    "sync_in_process",
    "tensor_bytes",
    "unflatten_bucket",
]
