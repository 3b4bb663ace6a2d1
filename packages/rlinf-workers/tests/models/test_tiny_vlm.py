"""The tiny LLaVA checkpoint loads as Hugging Face loads real image-text-to-text models."""

import numpy as np
from transformers import AutoModelForImageTextToText, AutoProcessor

from rlinf.workers.models.tiny_vlm import IMAGE_TOKEN, main, save_tiny_vlm


def test_saved_checkpoint_loads_with_the_auto_classes_and_runs(tmp_path):
    folder = save_tiny_vlm(tmp_path / "vlm", image_size=16, seed=3)
    model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True)
    processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
    image = np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    inputs = processor(images=[image], text=[f"{IMAGE_TOKEN}pick"], return_tensors="pt")
    assert inputs["pixel_values"].shape == (1, 3, 16, 16)
    logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], len(processor.tokenizer))


def test_same_seed_same_weights_and_the_command_prints_the_folder(tmp_path, capsys):
    assert main([str(tmp_path / "a"), "--image-size", "16", "--seed", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "a")
    save_tiny_vlm(tmp_path / "b", image_size=16, seed=1)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model.safetensors").read_bytes()
