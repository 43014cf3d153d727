import json

import torch

from mmaccel.image.tokenizers.vq import load_vq
from mmaccel.image.train import train_vq
from tests.image.test_data import write_fake_fashion_mnist

TINY = ["--codebook-size", "16", "--codebook-dim", "4", "--ch", "8", "--ch-mult", "1", "2", "--num-res-blocks", "1",
        "--z-channels", "8", "--norm-groups", "4", "--size", "16", "--batch-size", "4", "--threads", "1",
        "--ckpt-every", "3", "--log-every", "1"]


def test_train_resume_export(tmp_path):
    root = write_fake_fashion_mnist(tmp_path / "fm", n_train=10, n_test=6)
    out, export = tmp_path / "run", tmp_path / "vq.safetensors"
    common = ["--out", str(out), "--data-root", str(root), *TINY]
    assert train_vq.main([*common, "--steps", "3", "--no-eval"]) == 0
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 3

    assert train_vq.main([*common, "--steps", "5", "--export", str(export), "--recon-png", str(tmp_path / "r.png")]) == 0
    log = (out / "train.log").read_text()
    assert "resumed from" in log and "at step 3" in log and "step 5/5" in log and "step 1/5" not in log
    assert "differs" not in log  # same config restored, no rebuild
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 5

    model = load_vq(export)
    assert model.config.codebook_size == 16 and model.downsample == 2
    codes = model.encode(torch.zeros(1, 3, 16, 16))
    assert codes.shape == (1, 8, 8) and int(codes.max()) < 16
    result = json.loads((out / "eval.json").read_text())
    assert result["images"] == 6 and result["psnr_db"] > 0 and 0 < result["codebook_usage"] <= 1
    assert (tmp_path / "r.png").stat().st_size > 0
