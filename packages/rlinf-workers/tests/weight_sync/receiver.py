"""The rollout side of the cross-process weight-sync tests, run as a subprocess.

Usage: python receiver.py MODE IN_FILE OUT_FILE [PORT]
MODE is "shm", "gloo" or "cuda_ipc". IN_FILE holds (pickled) what the trainer sent ahead:
shm/CUDA IPC handles, or the layouts of the buckets it will broadcast. The script builds a
rollout engine on a differently initialised tiny model, loads the weights through the
transport, and saves the log-probs it assigns to the test's fixed sequences to OUT_FILE.
"""

from __future__ import annotations

import pickle
import sys

import torch

from rlinf.workers.models import TinyLMConfig, build_char_tokenizer, build_tiny_causal_lm
from rlinf.workers.rollout import HFRolloutEngine

CONFIG = TinyLMConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=128, attn_implementation="eager")


def fixed_sequences() -> dict[str, torch.Tensor]:
    """Prompts (left-padded) and responses (right-padded) to score after the sync."""
    gen = torch.Generator().manual_seed(1)
    return {
        "prompt_ids": torch.randint(4, 90, (3, 4), generator=gen),
        "prompt_mask": torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]]),
        "response_ids": torch.randint(4, 90, (3, 5), generator=gen),
        "response_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]),
    }


def log_probs_of(model: torch.nn.Module) -> torch.Tensor:
    from rlinf.workers.models import response_log_probs

    seqs = {k: v.to(next(model.parameters()).device) for k, v in fixed_sequences().items()}
    with torch.no_grad():
        return response_log_probs(model, **seqs).cpu()


def main() -> None:
    mode, in_file, out_file = sys.argv[1], sys.argv[2], sys.argv[3]
    device = "cuda" if mode == "cuda_ipc" else "cpu"
    model = build_tiny_causal_lm(CONFIG, seed=99, tokenizer=build_char_tokenizer())
    engine = HFRolloutEngine(model, eos_token_id=2, pad_token_id=0, device=device)
    before = log_probs_of(model)
    with open(in_file, "rb") as f:
        sent = pickle.load(f)
    if mode == "shm":
        from rlinf.workers.weight_sync import ShmWeightReceiver

        receiver = ShmWeightReceiver()
        for handle in sent:
            receiver.apply(handle, engine)
        receiver.close()
    elif mode == "cuda_ipc":
        from rlinf.workers.weight_sync import CudaIpcWeightReceiver

        for handle in sent:
            CudaIpcWeightReceiver().apply(handle, engine)
    else:
        from rlinf.workers.weight_sync import CollectiveWeightGroup

        group = CollectiveWeightGroup(host="127.0.0.1", port=int(sys.argv[4]), rank=1,
                                      world_size=2, backend="gloo", timeout=120)
        for metas, nbytes in sent:
            group.recv(metas, nbytes, engine)
        group.close()
    torch.save({"before": before, "after": log_probs_of(model)}, out_file)


if __name__ == "__main__":
    main()
