"""The next-scale trainers end to end on a fake Fashion-MNIST: tokenizer, VAR, CoDe refiner; resume and export."""

import json

import torch

from mmaccel.image.models.var import load_var
from mmaccel.image.tokenizers.msvq import load_msvq
from mmaccel.image.train import train_code, train_msvq, train_var
from tests.image.test_data import write_fake_fashion_mnist

MSVQ = ["--vocab-size", "16", "--z-channels", "4", "--ch", "8", "--ch-mult", "1", "2", "2", "--num-res-blocks", "1",
        "--norm-groups", "4", "--size", "16", "--patch-nums", "1", "2", "4", "--batch-size", "4", "--threads", "1",
        "--ckpt-every", "2", "--restart-every", "2"]


def test_tokenizer_var_and_refiner_train_resume_export(tmp_path):
    root = write_fake_fashion_mnist(tmp_path / "fm", n_train=12, n_test=6)
    vq_path = tmp_path / "msvq.safetensors"
    common = ["--out", str(tmp_path / "runs" / "msvq"), "--data-root", str(root), *MSVQ]
    assert train_msvq.main([*common, "--steps", "2"]) == 0
    assert train_msvq.main([*common, "--steps", "4", "--export", str(vq_path)]) == 0
    assert "resumed from" in (tmp_path / "runs" / "msvq" / "train.log").read_text()
    vq = load_msvq(vq_path)
    assert vq.patch_nums == (1, 2, 4) and [c.shape for c in vq.encode(torch.zeros(1, 3, 16, 16))] == [(1, 1), (1, 4), (1, 16)]
    assert json.loads((tmp_path / "runs" / "msvq" / "eval.json").read_text())["images"] == 6

    def var_run(name, *extra):
        return ["--out", str(tmp_path / "runs" / name), "--data-root", str(root), "--vq", str(vq_path),
                "--batch-size", "4", "--threads", "1", "--ckpt-every", "2", "--log-every", "1", "--eval-every", "2",
                "--eval-images", "4", "--warmup", "1", *extra]

    large, small = tmp_path / "large.safetensors", tmp_path / "small.safetensors"
    assert train_var.main(var_run("large", "--depth", "2", "--width", "32", "--heads", "2", "--steps", "2")) == 0
    cached = torch.load(tmp_path / "runs" / "msvq_tokens_train.pt", weights_only=True)
    assert cached["tokens"].shape == (12, 21) and int(cached["tokens"].max()) < 16
    assert train_var.main(var_run("large", "--depth", "2", "--width", "32", "--heads", "2", "--steps", "3",
                                  "--export", str(large))) == 0
    assert "at step 2" in (tmp_path / "runs" / "large" / "train.log").read_text()
    assert train_var.main(var_run("small", "--depth", "1", "--width", "16", "--heads", "2", "--steps", "2",
                                  "--export", str(small))) == 0
    model = load_var(large)
    assert (model.config.depth, model.config.vocab_size, model.num_classes, model.patch_nums) == (2, 16, 10, (1, 2, 4))
    result = json.loads((tmp_path / "runs" / "large" / "eval.json").read_text())
    assert result["images"] == 4 and set(result["per_scale"]) == {"1", "2", "4"} and 0 < result["loss"] < 10

    refined = tmp_path / "small_code2.safetensors"
    assert train_code.main(["--out", str(tmp_path / "runs" / "code"), "--teacher", str(large), "--student", str(small),
                            "--draft-steps", "2", "--vq", str(vq_path), "--data-root", str(root), "--steps", "2",
                            "--batch-size", "4", "--eval-images", "4", "--export", str(refined)]) == 0
    report = json.loads((tmp_path / "runs" / "code" / "eval.json").read_text())
    assert report["draft_steps"] == 2 and report["after"]["kl_to_teacher"] >= 0
    assert load_var(refined).config == load_var(small).config
    assert train_code.main(["--out", str(tmp_path / "runs" / "code_guided"), "--teacher", str(large), "--student",
                            str(small), "--draft-steps", "2", "--vq", str(vq_path), "--data-root", str(root), "--steps",
                            "1", "--batch-size", "4", "--eval-images", "4", "--guidance", "2"]) == 0
    report = json.loads((tmp_path / "runs" / "code_guided" / "eval.json").read_text())
    assert report["guidance"] == 2 and report["after"]["guided_kl_to_teacher"] >= 0


def test_a_refiner_equal_to_its_teacher_has_no_distillation_loss():
    """Both distillation terms (conditional and guided) vanish when the student is the teacher, and the
    guided term sees what guidance does: a student that only matches the conditional logits is not free."""
    from tests.image.test_msvq import tiny_model
    from tests.image.test_var import tiny_var

    vq, teacher = tiny_model(), tiny_var(0)
    labels, tokens = torch.tensor([0, 3]), torch.randint(0, 32, (2, 30), generator=torch.Generator().manual_seed(0))
    for guidance in (0.0, 2.0):
        loss, ce, kl = train_code.refiner_loss(teacher, teacher, vq, labels, tokens, 2, alpha=0.0, guidance=guidance)
        assert abs(loss.item()) < 1e-5 and abs(kl) < 1e-5 and ce > 0
    ramp = train_code.scale_ramp(teacher, 3.0)
    assert ramp[0] == 0 and ramp[-1] == 3.0 and len(ramp) == teacher.offsets[-1]
    cond, null = torch.randn(1, 30, 8), torch.randn(1, 30, 8)
    assert torch.allclose(train_code.guided(torch.cat((cond, null)), torch.zeros(30)), cond)
