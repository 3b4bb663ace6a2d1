"""A tiny LLaVA checkpoint saved to a folder: the pretrained-VLA path without a download.

`save_tiny_vlm` writes a randomly initialised `LlavaForConditionalGeneration` (a one-layer
SigLIP vision tower, a tiny Qwen2 decoder) with its `LlavaProcessor` (the char tokenizer
plus an ``<image>`` token, a SigLIP image processor) in the layout ``save_pretrained``
writes for real checkpoints, so ``AutoModelForImageTextToText.from_pretrained`` and
``AutoProcessor.from_pretrained`` load it as they load LLaVA or PaliGemma. Tests and the
README use it to exercise `policy.vla.pretrained` on a CPU:

    python -m rlinf.workers.models.tiny_vlm /tmp/tiny-vlm
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch
from transformers import (
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    Qwen2Config,
    SiglipVisionConfig,
)
from transformers.utils import logging as hf_logging

from rlinf.workers.models.tokenizer import build_char_tokenizer

__all__ = ["IMAGE_TOKEN", "save_tiny_vlm"]

IMAGE_TOKEN = "<image>"
"""The processor's placeholder for the image's patch embeddings."""


def _image_processor(image_size: int) -> object:
    import transformers

    # The PIL processor needs no torchvision (the torchvision one is preferred when present).
    cls = (getattr(transformers, "SiglipImageProcessorPil", None)
           or transformers.SiglipImageProcessor)
    return cls(size={"height": image_size, "width": image_size})


def save_tiny_vlm(folder: str | os.PathLike[str], *, image_size: int = 32, patch_size: int = 8,
                  hidden_size: int = 32, num_layers: int = 2, seed: int = 0) -> str:
    """Write a tiny LLaVA model and processor to `folder` (created); returns its path."""
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    image_token_id = int(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN))  # type: ignore[arg-type]
    num_patches = (image_size // patch_size) ** 2
    config = LlavaConfig(
        vision_config=SiglipVisionConfig(
            hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=1,
            num_attention_heads=2, image_size=image_size, patch_size=patch_size),
        text_config=Qwen2Config(
            vocab_size=len(tokenizer), hidden_size=hidden_size,
            intermediate_size=2 * hidden_size, num_hidden_layers=num_layers,
            num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=num_patches + 256, use_sliding_window=False,
            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id),
        image_token_index=image_token_id, vision_feature_select_strategy="full",
        vision_feature_layer=-1, projector_hidden_act="gelu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
    processor = LlavaProcessor(
        image_processor=_image_processor(image_size), tokenizer=tokenizer,
        patch_size=patch_size, vision_feature_select_strategy="full", image_token=IMAGE_TOKEN,
        num_additional_image_tokens=0)
    path = os.fspath(folder)
    os.makedirs(path, exist_ok=True)
    hf_logging.disable_progress_bar()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlinf.workers.models.tiny_vlm FOLDER [--image-size N]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="where to write the checkpoint")
    parser.add_argument("--image-size", type=int, default=32, help="side of the model's images")
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed")
    args = parser.parse_args(argv)
    print(save_tiny_vlm(args.folder, image_size=args.image_size, seed=args.seed))
    return 0


if __name__ == "__main__":  # pragma: no cover - `python -m rlinf.workers.models.tiny_vlm`
    raise SystemExit(main())
