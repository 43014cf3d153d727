"""The early-exit rule, its cost and the budgeted threshold on hand-made posteriors."""

import math

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.speech.ctc.early_exit import early_exit, encoder_cost, pick_threshold, utterance_confidence

V = 4


def frames(p_best: float, T: int) -> torch.Tensor:
    """[T, V] log-probabilities with `p_best` on label 1 and the rest spread evenly."""
    probs = torch.full((T, V), (1 - p_best) / (V - 1))
    probs[:, 1] = p_best
    return probs.log()


def batch(p_best: list[float], T: int = 5, lengths=(5, 3, 4)) -> torch.Tensor:
    out = torch.zeros(len(p_best), T, V)
    for b, (p, n) in enumerate(zip(p_best, lengths)):
        out[b, :n] = frames(p, n)
        out[b, n:] = frames(0.25, T - n)           # junk past the length must be ignored
    return out


def test_confidence_ignores_padding():
    lengths = torch.tensor([5, 3, 4])
    lp = batch([0.97, 0.7, 0.25])
    entropy = utterance_confidence(lp, lengths, "entropy")
    assert entropy[2].item() == pytest.approx(math.log(V), abs=1e-6)
    p, q = 0.97, 0.01
    assert entropy[0].item() == pytest.approx(-(p * math.log(p) + 3 * q * math.log(q)), abs=1e-5)
    torch.testing.assert_close(utterance_confidence(lp, lengths, "max-prob"), torch.tensor([0.97, 0.7, 0.25]))
    with pytest.raises(InputError, match="criterion"):
        utterance_confidence(lp, lengths, "margin")


def test_early_exit_picks_first_confident_head():
    lengths = torch.tensor([5, 3, 4])
    by_layer = {2: batch([0.97, 0.6, 0.3]), 4: batch([0.98, 0.95, 0.4]), 6: batch([0.99, 0.99, 0.5])}
    out = early_exit(by_layer, lengths, "max-prob", 0.9)
    assert out.layers.tolist() == [2, 4, 6]                  # the last head takes what no head was sure of
    for b, k in enumerate([2, 4, 6]):
        n = int(lengths[b])
        torch.testing.assert_close(out.log_probs[b, :n], by_layer[k][b, :n])
        assert bool((out.log_probs[b, n:] == 0).all())
    assert early_exit(by_layer, lengths, "entropy", 0.3).layers.tolist() == [2, 4, 6]
    assert early_exit(by_layer, lengths, "entropy", 10.0).layers.tolist() == [2, 2, 2]
    assert encoder_cost(out.layers, 6) == pytest.approx(12 / 18)


def test_pick_threshold_meets_budget():
    lengths = torch.tensor([5, 3, 4])
    by_layer = {2: batch([0.97, 0.6, 0.3]), 4: batch([0.98, 0.95, 0.4]), 6: batch([0.99, 0.99, 0.5])}
    for criterion in ("entropy", "max-prob"):
        assert encoder_cost(early_exit(by_layer, lengths, criterion,
                                       pick_threshold(by_layer, lengths, 6, 1.0, criterion)).layers, 6) == 1.0
        for budget, cost in ((0.7, 12 / 18), (0.6, 10 / 18), (0.34, 6 / 18)):
            t = pick_threshold(by_layer, lengths, 6, budget, criterion)
            assert encoder_cost(early_exit(by_layer, lengths, criterion, t).layers, 6) == pytest.approx(cost)
    with pytest.raises(InputError, match="budget of 0.200"):
        pick_threshold(by_layer, lengths, 6, 0.2)
    with pytest.raises(InputError, match="1..6"):
        encoder_cost([0, 6], 6)
