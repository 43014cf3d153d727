"""The CTC head trainer: window packing, a loss that falls, resuming that changes nothing, the CLI's --help."""

import numpy as np
import pytest
import torch
from torch import nn

from mmaccel.speech.ctc.train import collate, main, pack, plan_windows, train_heads
from mmaccel.speech.ctc.whisper_ctc import CTCHead

D, V = 16, 29


def windows(n: int = 6, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        T = 20 + 2 * i
        out.append({"hidden": {k: torch.randn(T, D, generator=g).half() for k in (1, 2)},
                    "labels": torch.randint(2, V, (3 + i % 3,), generator=g, dtype=torch.int32)})
    return out


def heads(seed: int = 0) -> nn.ModuleDict:
    torch.manual_seed(seed)
    return nn.ModuleDict({str(k): CTCHead(D, V, width=32, heads=2, layers=1, dropout=0.0) for k in (1, 2)})


def test_plan_windows_and_pack():
    durations = [4.0, 5.0, 9.0, 25.0, 3.0, 3.0]
    plan = plan_windows(durations, window_s=10.0, gap_s=0.5)
    assert plan == [[0, 1], [2], [3], [4, 5]]                       # 4 + 0.5 + 5 fits; + 0.5 + 9 does not
    packed = pack([np.ones(10, np.float32), np.ones(5, np.float32)], gap_s=0.001)
    assert packed.tolist() == [1.0] * 10 + [0.0] * 16 + [1.0] * 5


def test_collate_pads_and_concatenates():
    hidden, lengths, targets, target_lengths = collate(windows(3), [1, 2])
    assert hidden[1].shape == (3, 24, D) and lengths.tolist() == [20, 22, 24]
    assert target_lengths.tolist() == [3, 4, 5] and targets.shape == (12,) and targets.dtype == torch.long
    assert bool((hidden[2][0, 20:] == 0).all())


def test_ctc_loss_goes_down():
    history = train_heads(heads(), windows(), steps=30, batch_size=4, lr=3e-3, warmup=5, log_every=0)
    assert len(history) == 30 and set(history[0]) == {1, 2}
    for k in (1, 2):
        first, last = np.mean([h[k] for h in history[:5]]), np.mean([h[k] for h in history[-5:]])
        assert last < 0.7 * first, (k, first, last)


def test_resume_from_checkpoint_equals_uninterrupted(tmp_path):
    data = windows()
    straight = heads()
    train_heads(straight, data, steps=12, batch_size=3, warmup=3, checkpoint=tmp_path / "a.pt", checkpoint_every=6,
                log_every=0)

    class Killed(Exception):
        pass

    def kill_at_step_6(message):
        if "step 6/" in message:
            raise Killed

    with pytest.raises(Killed):          # killed right after the step-6 checkpoint
        train_heads(heads(), data, steps=12, batch_size=3, warmup=3, checkpoint=tmp_path / "b.pt",
                    checkpoint_every=6, log_every=6, log=kill_at_step_6)
    resumed = heads(seed=1)              # other initial weights: everything must come from the checkpoint
    messages = []
    history = train_heads(resumed, data, steps=12, batch_size=3, warmup=3, checkpoint=tmp_path / "b.pt",
                          checkpoint_every=6, log_every=6, log=messages.append)
    assert "resumed" in messages[0] and len(history) == 12
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--window-s" in text and "--copies" in text and "corpus,features,train,eval,export" in text


def test_stride2_heads_train_and_start_from_stride1_heads(tmp_path):
    from types import SimpleNamespace

    from transformers import WhisperFeatureExtractor

    from mmaccel.errors import InputError
    from mmaccel.speech.ctc.train import init_heads
    from mmaccel.speech.ctc.whisper_ctc import WhisperCTC
    from tests.speech.conftest import tiny_whisper

    bundle = SimpleNamespace(model=tiny_whisper(), feature_extractor=WhisperFeatureExtractor(feature_size=8), name="t")
    torch.manual_seed(0)
    one = WhisperCTC(bundle, width=32, heads=2, layers=1, source="t")
    one.save(tmp_path / "one")
    two = WhisperCTC(bundle, width=32, heads=2, layers=1, stride=2, source="t")
    init_heads(two, tmp_path / "one")
    a, b = torch.randn(2, 3, one.d_model).unbind(0)
    for k in one.exit_layers:
        first, second = one.heads[str(k)], two.heads[str(k)]
        with torch.no_grad():                      # at first the stride-2 head reads the mean of its two frames
            torch.testing.assert_close(second.proj(torch.cat([a, b], -1)), first.proj((a + b) / 2), atol=2e-3, rtol=0)
    d = one.d_model
    heads2 = nn.ModuleDict({str(k): CTCHead(d, V, width=32, heads=2, layers=1, dropout=0.0, stride=2) for k in (1, 2)})
    data = [{"hidden": {k: torch.randn(30, d).half() for k in (1, 2)}, "labels": torch.randint(1, V, (4,))}
            for _ in range(4)]
    losses = train_heads(heads2, data, steps=30, batch_size=4, lr=3e-3, warmup=1, log_every=0)
    assert losses[-1][1] < losses[0][1]
    wide = WhisperCTC(bundle, width=48, heads=2, layers=1, source="t")
    with pytest.raises(InputError, match="does not fit these heads"):
        init_heads(wide, tmp_path / "one")
    with pytest.raises(InputError, match="no ctc_heads.safetensors"):
        init_heads(wide, tmp_path)


def test_load_windows_reads_every_folder_and_checks_layers(tmp_path):
    from mmaccel.errors import InputError
    from mmaccel.speech.ctc.train import load_windows

    for name, data, layers in (("a", windows(2), [1, 2]), ("b", windows(3, seed=1), [1, 2]), ("c", windows(1), [1])):
        (tmp_path / name).mkdir()
        torch.save({"windows": data, "exit_layers": layers}, tmp_path / name / "shard_00000.pt")
    both = load_windows([tmp_path / "a", tmp_path / "b"], [2, 1])
    assert len(both) == 5 and both[2]["labels"].tolist() == windows(3, seed=1)[0]["labels"].tolist()
    with pytest.raises(InputError, match="holds layers"):
        load_windows([tmp_path / "a", tmp_path / "c"], [1, 2])
    with pytest.raises(InputError, match="no feature shards"):
        load_windows([tmp_path / "a", tmp_path / "empty"], [1, 2])
