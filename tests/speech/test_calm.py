"""CALM early exit: threshold 1 is greedy bit for bit; lower thresholds exit earlier, are reported,
write state-propagated keys/values; calibration respects its budget; bad input is named."""

import pytest
import torch
from torch import nn

from mmaccel.core.methods import Resources
from mmaccel.errors import InputError
from mmaccel.speech.calm import calibrate_threshold, calm_decode, token_disagreement
from mmaccel.speech.heads import new_exit_heads
from mmaccel.speech.methods import build_asr_method
from tests.speech.conftest import EOT, PROMPT, features


def _exits(tiny_decoder, seed=5, std=0.3):
    torch.manual_seed(seed)
    exits = new_exit_heads(tiny_decoder, [1, 2, 3])
    for head in exits.values():
        for p in head.parameters():
            nn.init.normal_(p, std=std)
    return exits


def _run(tiny_decoder, exits, threshold, batch=3, seed=11):
    method = build_asr_method("calm", threshold=threshold)
    return method.run(Resources(tiny_decoder, exit_heads=exits), tiny_decoder.encode(features(batch, seed=seed), PROMPT),
                      max_new_tokens=20, eos_token_id=EOT)


def test_threshold_one_is_greedy_bit_for_bit(tiny_decoder):
    exits = _exits(tiny_decoder)
    greedy = build_asr_method("greedy").run(Resources(tiny_decoder), tiny_decoder.encode(features(3, seed=11), PROMPT),
                                            max_new_tokens=20, eos_token_id=EOT)
    calm = _run(tiny_decoder, exits, 1.0)
    assert calm.tokens == greedy.tokens
    assert calm.stats.mean_exit_layer == 4.0 and calm.stats.nfe == greedy.stats.nfe
    assert build_asr_method("calm", threshold=1.0).lossless and not build_asr_method("calm", threshold=0.9).lossless


def test_lower_thresholds_exit_earlier_and_change_little_at_first(tiny_decoder):
    exits = _exits(tiny_decoder)
    layers = [_run(tiny_decoder, exits, t).stats.mean_exit_layer for t in (1.0, 0.6, 0.3, 0.0)]
    assert layers == sorted(layers, reverse=True) and layers[0] == 4.0 and layers[-1] == 1.0
    hist = _run(tiny_decoder, exits, 0.3).stats.exit_hist
    assert set(hist) <= {1, 2, 3, 4} and sum(hist.values()) > 0


def test_exits_emit_what_the_early_exit_view_would(tiny_decoder):
    # threshold 0: every token after the first (the full model's prefill) leaves at the only head,
    # after layer 3, so each must be the arg-max of the 3-layer view fed the same tokens
    exits = {3: _exits(tiny_decoder)[3]}
    x = features(2, seed=4)
    calm = calm_decode(tiny_decoder, exits, tiny_decoder.encode(x, PROMPT), threshold=0.0, max_new_tokens=12,
                       eos_token_id=EOT)
    assert calm.stats.exit_hist == {3: sum(len(r) - 1 for r in calm.tokens)}
    view = tiny_decoder.early_exit(3, exits[3])
    for b, row in enumerate(calm.tokens):
        state = view.prefill(tiny_decoder.encode(x[b : b + 1], PROMPT), 16)
        assert view.step(state, torch.tensor([row[:-1]]))[0].argmax(-1).tolist() == row[1:]


def test_exited_rows_still_write_keys_and_values_for_later_tokens(tiny_decoder):
    x = tiny_decoder.encode(features(1, seed=2), PROMPT)
    state = tiny_decoder.prefill(x, 8)
    with torch.inference_mode():
        h, step = tiny_decoder.embed(state, torch.tensor([[5]]))
        before = [k[:, :, 2].clone() for k in state.cache.k]
        h1 = tiny_decoder.layer(0, h, step)
        for i in range(1, 4):                             # the row exited after layer 1: propagate only
            assert torch.equal(tiny_decoder.layer(i, h1, step, rows=torch.tensor([], dtype=torch.long)), h1)
    after = [k[:, :, 2] for k in state.cache.k]
    assert all(not torch.equal(a, b) for a, b in zip(before, after))   # every layer wrote position 2


def test_calibration_keeps_its_budget(tiny_decoder):
    exits = _exits(tiny_decoder)
    batches = [tiny_decoder.encode(features(2, seed=s), PROMPT) for s in (1, 2)]
    threshold, tried = calibrate_threshold(tiny_decoder, exits, batches, delta=0.1, max_new_tokens=12, eos_token_id=EOT)
    within = [t for t, spent, _ in tried if spent <= 0.1]
    assert threshold == (min(within) if within else 1.0)
    assert all(spent <= 0.1 for t, spent, _ in tried if t >= threshold)
    zero, _ = calibrate_threshold(tiny_decoder, exits, batches, delta=0.0, max_new_tokens=12, eos_token_id=EOT)
    assert zero >= threshold


def test_token_disagreement():
    assert token_disagreement([[1, 2, 3]], [[1, 2, 3]]) == 0.0
    assert token_disagreement([[1, 2, 3], [4]], [[1, 3], [4, 5]]) == pytest.approx(2 / 4)


def test_bad_inputs_are_named(tiny_decoder):
    with pytest.raises(InputError, match=r"threshold must be in \[0.0, 1.0\]"):
        build_asr_method("calm", threshold=1.5)
    with pytest.raises(InputError, match="needs trained early-exit heads"):
        _run(tiny_decoder, None, 0.9)
    with pytest.raises(InputError, match="takes no temperature"):
        from mmaccel.core.sampling import Sampling
        build_asr_method("calm").run(Resources(tiny_decoder, exit_heads=_exits(tiny_decoder)),
                                     tiny_decoder.encode(features(1), PROMPT), max_new_tokens=4,
                                     sampling=Sampling(temperature=1.0))
