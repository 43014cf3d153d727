import json

import torch

from mmaccel.image.models.gpt import GPTConfig, LlamaGenGPT, load_gpt, save_gpt
from mmaccel.image.tokenizers.vq import VQConfig, VQModel, save_vq
from mmaccel.image.train import train_sjd2
from mmaccel.image.train.train_sjd2 import noise_levels
from tests.image.test_data import write_fake_fashion_mnist


def test_noise_levels_clean_prefix_rising_window_then_pure_noise():
    g = torch.Generator().manual_seed(0)
    levels, scored = noise_levels(64, 40, 6, 0.0, g)
    assert levels.shape == (64, 40) and scored.shape == (64, 41)
    for row, score in zip(levels, scored):
        noisy = (row > 0).nonzero().flatten()
        assert len(noisy) > 0
        s = int(noisy[0])
        assert bool((row[:s] == 0).all()) and bool((row[s:] > 0).all())
        assert bool((row[s:].diff() >= 0).all())                                  # rising
        w = int((row[s:] < 1).sum())                                              # the window proper
        assert 1 <= w <= 6 and bool((row[s + w:] == 1).all())                     # then pure noise
        assert int(score.sum()) == min(41, s + w + 3)                            # up to two outputs past it
    levels, scored = noise_levels(200, 40, 6, 1.0, g)            # all rows clean, all scored
    assert float(levels.abs().sum()) == 0 and bool(scored.all())


def test_fine_tune_resume_export(tmp_path):
    root = write_fake_fashion_mnist(tmp_path / "fm", n_train=12, n_test=6)
    torch.manual_seed(0)
    vq = VQModel(VQConfig(codebook_size=16, codebook_embed_dim=4, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1,
                          z_channels=8, norm_groups=4))
    vq_path = save_vq(vq, tmp_path / "vq.safetensors")
    init = save_gpt(LlamaGenGPT(GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=16, num_classes=10, block_size=256,
                                          multiple_of=32)), tmp_path / "gpt.safetensors")
    out, export = tmp_path / "runs" / "sjd2", tmp_path / "gpt_sjd2.safetensors"
    common = ["--out", str(out), "--data-root", str(root), "--vq", str(vq_path), "--init", str(init),
              "--batch-size", "4", "--ckpt-every", "2", "--log-every", "1", "--eval-images", "4", "--warmup", "1",
              "--window", "4"]
    assert train_sjd2.main([*common, "--steps", "2"]) == 0
    assert train_sjd2.main([*common, "--steps", "3", "--export", str(export)]) == 0
    log = (out / "train.log").read_text()
    assert "resumed from" in log and "step 3/3" in log
    result = json.loads((out / "eval.json").read_text())
    assert set(result["after"]) == {"clean_loss", "window_loss"} and result["steps"] == 3
    tuned, start = load_gpt(export), load_gpt(init)
    assert tuned.config == start.config
    assert not torch.equal(tuned.tok_embeddings.weight, start.tok_embeddings.weight)
