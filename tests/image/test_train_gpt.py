import json

import torch

from mmaccel.image.models.gpt import load_gpt
from mmaccel.image.tokenizers.vq import VQConfig, VQModel, save_vq
from mmaccel.image.train import train_gpt
from tests.image.test_data import write_fake_fashion_mnist


def test_tokenise_train_resume_export(tmp_path):
    root = write_fake_fashion_mnist(tmp_path / "fm", n_train=12, n_test=6)
    torch.manual_seed(0)
    vq = VQModel(VQConfig(codebook_size=16, codebook_embed_dim=4, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1,
                          z_channels=8, norm_groups=4))            # downsample 4: 64x64 -> 16x16 codes
    vq_path = save_vq(vq, tmp_path / "vq.safetensors")
    out, export = tmp_path / "runs" / "gpt", tmp_path / "gpt.safetensors"
    common = ["--out", str(out), "--data-root", str(root), "--vq", str(vq_path), "--preset", "GPT-nano",
              "--vocab-size", "16", "--batch-size", "4", "--threads", "1", "--ckpt-every", "3", "--log-every", "1",
              "--eval-limit", "4", "--warmup", "2"]
    assert train_gpt.main([*common, "--steps", "3"]) == 0
    cached = torch.load(tmp_path / "runs" / "tokens_train.pt", weights_only=True)
    assert cached["tokens"].shape == (12, 256) and int(cached["tokens"].max()) < 16
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 3

    assert train_gpt.main([*common, "--steps", "5", "--export", str(export)]) == 0
    log = (out / "train.log").read_text()
    assert "resumed from" in log and "at step 3" in log and "step 5/5" in log
    model = load_gpt(export)
    assert model.config.vocab_size == 16 and model.num_classes == 10 and model.config.has_null_class
    result = json.loads((out / "eval.json").read_text())
    assert result["held_out_images"] == 4 and 0 < result["held_out_loss"] < 10
