"""The continuous-token trainers end to end on a fake Fashion-MNIST: KL tokenizer, MAR; resume and export."""

import json

import torch

from mmaccel.image.models.mar import load_mar
from mmaccel.image.tokenizers.kl import load_kl
from mmaccel.image.train import train_kl, train_mar
from tests.image.test_data import write_fake_fashion_mnist

KL = ["--channels", "8", "16", "--latent-channels", "2", "--norm-groups", "4", "--size", "8", "--batch-size", "4",
      "--threads", "1", "--ckpt-every", "2", "--log-every", "1", "--scale-images", "8"]


def test_kl_tokenizer_and_mar_train_resume_export(tmp_path):
    root = write_fake_fashion_mnist(tmp_path / "fm", n_train=12, n_test=6)
    kl_path = tmp_path / "kl.safetensors"
    common = ["--out", str(tmp_path / "runs" / "kl"), "--data-root", str(root), *KL]
    assert train_kl.main([*common, "--steps", "2"]) == 0
    assert train_kl.main([*common, "--steps", "3", "--export", str(kl_path)]) == 0
    assert "resumed from" in (tmp_path / "runs" / "kl" / "train.log").read_text()
    kl = load_kl(kl_path)
    assert kl.config.scale != 1.0 and kl.seq_len == 16 and kl.token_dim == 2
    assert json.loads((tmp_path / "runs" / "kl" / "eval.json").read_text())["images"] == 6

    def mar_run(*extra):
        return ["--out", str(tmp_path / "runs" / "mar"), "--data-root", str(root), "--kl", str(kl_path),
                "--width", "16", "--depth", "1", "--heads", "2", "--buffer", "1", "--head-width", "16", "--head-depth",
                "1", "--batch-size", "4", "--threads", "1", "--ckpt-every", "2", "--log-every", "1", "--eval-every", "2",
                "--eval-images", "4", "--warmup", "1", *extra]

    out = tmp_path / "mar.safetensors"
    assert train_mar.main(mar_run("--steps", "2")) == 0
    cached = torch.load(tmp_path / "runs" / "kl_moments_train.pt", weights_only=True)
    assert cached["tokens"].shape == (12, 2, 16, 2) and bool((cached["tokens"][:, 1] > 0).all())   # (mean, std)
    assert train_mar.main(mar_run("--steps", "3", "--export", str(out))) == 0
    assert "at step 2" in (tmp_path / "runs" / "mar" / "train.log").read_text()
    model = load_mar(out)
    assert (model.config.seq_len, model.config.token_dim, model.num_classes) == (16, 2, 10)
    assert model.token_proj.weight.dtype == torch.float32                   # shipped fp16, run fp32
    result = json.loads((tmp_path / "runs" / "mar" / "eval.json").read_text())
    assert result["eval_images"] == 4 and 0 < result["held_out_loss"] < float("inf")   # random weights: any size
