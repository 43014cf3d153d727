import pytest
import torch

from mmaccel.image.train.common import batch_indices, cosine_lr, read_checkpoint, restore, save_checkpoint


def test_batches_depend_only_on_seed_and_step():
    a = batch_indices(100, 8, seed=0, step=7)
    assert torch.equal(a, batch_indices(100, 8, seed=0, step=7))
    assert not torch.equal(a, batch_indices(100, 8, seed=0, step=8))
    assert not torch.equal(a, batch_indices(100, 8, seed=1, step=7))


def test_cosine_lr_warms_up_then_decays_to_a_tenth():
    lrs = [cosine_lr(s, lr=1.0, warmup=10, steps=110) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[110] == pytest.approx(0.1) and lrs[119] == pytest.approx(0.1)


def test_checkpoint_round_trip(tmp_path):
    path = tmp_path / "ckpt.pt"
    assert read_checkpoint(path) is None
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    save_checkpoint(path, model, opt, 5, {"width": 3})
    assert not path.with_suffix(".tmp").exists()
    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    ckpt = read_checkpoint(path)
    assert ckpt["config"] == {"width": 3}
    assert restore(ckpt, fresh, fresh_opt, path) == 5
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
