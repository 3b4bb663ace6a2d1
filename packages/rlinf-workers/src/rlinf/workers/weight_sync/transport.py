"""Which weight-sync transport a placement implies."""

from __future__ import annotations

from typing import Literal

__all__ = ["Transport", "choose_transport"]

Transport = Literal["inprocess", "shm", "cuda_ipc", "nccl", "gloo"]


def choose_transport(*, same_process: bool, same_node: bool, same_device: bool,
                     on_gpu: bool) -> Transport:
    """The cheapest transport between the actor's and the rollout's weights.

    Same process: hand over references. Collocated on one GPU: CUDA IPC (no host round
    trip). Other GPUs or nodes: an NCCL broadcast. CPU on one node: shared memory; CPU
    across nodes: a gloo broadcast over TCP.
    """
    if same_process:
        return "inprocess"
    if on_gpu:
        return "cuda_ipc" if same_node and same_device else "nccl"
    return "shm" if same_node else "gloo"
