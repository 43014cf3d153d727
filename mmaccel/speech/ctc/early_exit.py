"""Early exit for CTC heads on intermediate encoder layers: stop at the first head that is confident.

A CTC model with heads after several encoder layers (`WhisperCTC`) can stop an utterance at the
first head whose output is confident enough, and skip the remaining layers (DeeBERT's entropy rule,
Xin et al. 2020; for ASR encoders, Wright et al. 2023, "Training dynamic models using early exits for
automatic speech recognition on resource-constrained devices"). Confidence is
the mean over the utterance's frames of a per-frame score of the head's posterior:

- `"entropy"`: the entropy of the frame's label distribution, -sum_v p_v log p_v (nats); an
  utterance exits when its mean entropy is <= the threshold;
- `"max-prob"`: the probability of the frame's best label; it exits when the mean is >= the threshold.

The functions here work on log-probabilities already computed for every head (`log_probs_all`), which
is what analysis and threshold tuning need; `WhisperCTC.transcribe_early_exit` makes the same choice
while running the encoder incrementally, so later layers are really skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mmaccel.errors import InputError, check

CRITERIA = ("entropy", "max-prob")


@dataclass
class EarlyExitResult:
    """Each utterance's exit layer [B], the log-probabilities of its chosen head [B, T, V] (frames past a
    row's length are 0: padding, not probabilities) and its frame counts [B]."""

    layers: Tensor
    log_probs: Tensor
    lengths: Tensor


def utterance_confidence(log_probs: Tensor, lengths: Tensor, criterion: str = "entropy") -> Tensor:
    """[B] the mean over each utterance's frames of the per-frame criterion (entropy in nats, or max
    probability) of `log_probs` [B, T, V]."""
    check(criterion in CRITERIA, f"criterion must be one of {', '.join(CRITERIA)}, got {criterion!r}")
    log_probs = log_probs.float()
    if criterion == "entropy":
        frame = -(log_probs.exp() * log_probs).sum(-1)                                # [B, T]
    else:
        frame = log_probs.max(-1).values.exp()
    inside = torch.arange(log_probs.shape[1], device=log_probs.device)[None] < lengths.to(log_probs.device)[:, None]
    return (frame * inside).sum(1) / lengths.to(log_probs.device).clamp(min=1)


def confident(score: Tensor, criterion: str, threshold: float) -> Tensor:
    """[B] bool: which utterance scores pass `threshold` (entropy: <=, max-prob: >=)."""
    return score <= threshold if criterion == "entropy" else score >= threshold


def mask_padding(log_probs: Tensor, lengths: Tensor) -> Tensor:
    """`log_probs` [B, T, V] with the frames past each row's length set to 0."""
    inside = torch.arange(log_probs.shape[1], device=log_probs.device)[None] < lengths.to(log_probs.device)[:, None]
    return log_probs * inside[..., None]


def _check_layers(log_probs_by_layer: Mapping[int, Tensor], lengths: Tensor) -> list[int]:
    check(isinstance(log_probs_by_layer, Mapping) and len(log_probs_by_layer) > 0,
          "give the log-probabilities of every exit head as a dict {layer: [B, T, V]}")
    layers = sorted(log_probs_by_layer)
    shapes = {tuple(log_probs_by_layer[k].shape) for k in layers}
    check(len(shapes) == 1 and len(next(iter(shapes))) == 3,
          f"every head's log-probabilities must have the same shape [B, T, V], got {sorted(shapes)}")
    check(tuple(lengths.shape) == next(iter(shapes))[:1], f"lengths must be [B] = {next(iter(shapes))[:1]}, "
          f"got {tuple(lengths.shape)}")
    return layers


def exit_layers_for(scores: Tensor, layers: Sequence[int], criterion: str, threshold: float) -> Tensor:
    """[B] the first layer whose utterance score passes, else the last. `scores` [L, B] per layer in
    `layers` (ascending)."""
    passed = confident(scores, criterion, threshold)
    passed[-1] = True                                       # the last head always takes what is left
    first = passed.float().argmax(0)                        # the first True along the layers
    return torch.tensor(list(layers), device=scores.device)[first]


def early_exit(log_probs_by_layer: Mapping[int, Tensor], lengths: Tensor, criterion: str = "entropy",
               threshold: float = 0.1) -> EarlyExitResult:
    """Per utterance the first exit layer whose mean per-frame criterion passes `threshold`, else the
    last, and the chosen heads' log-probabilities.

    log_probs_by_layer: {layer: [B, T, V]} of every head (as `WhisperCTC.log_probs_all` gives them);
    lengths: [B] frame counts. Returns `EarlyExitResult(layers [B], log_probs [B, T, V], lengths [B])`.
    """
    layers = _check_layers(log_probs_by_layer, lengths)
    stacked = torch.stack([log_probs_by_layer[k].float() for k in layers])            # [L, B, T, V]
    scores = torch.stack([utterance_confidence(lp, lengths, criterion) for lp in stacked])   # [L, B]
    chosen = exit_layers_for(scores, layers, criterion, threshold)
    index = torch.tensor(layers, device=chosen.device)
    which = (chosen[:, None] == index[None]).float().argmax(1)                          # [B] position in layers
    picked = stacked[which, torch.arange(stacked.shape[1], device=which.device)]
    return EarlyExitResult(chosen, mask_padding(picked, lengths), lengths)


def encoder_cost(layers_run: Tensor | Sequence[int], num_layers: int) -> float:
    """The mean fraction of the encoder's layers run: mean(layers_run) / num_layers.

    The convolutional stem (two 1-D convolutions) is counted as part of the first layer; for Whisper
    base it is ~4 % of the encoder's multiply-adds, so the fraction is a close proxy for compute. The
    heads are not counted (each is ~1/4 of an encoder layer at the defaults).
    """
    layers_run = torch.as_tensor(layers_run).detach().cpu().double()
    check(layers_run.numel() > 0, "no utterances to cost")
    check(num_layers >= 1 and bool(((layers_run >= 1) & (layers_run <= num_layers)).all()),
          f"layers run must be in 1..{num_layers}, got {layers_run.tolist()}")
    return float(layers_run.mean()) / num_layers


def pick_threshold(log_probs_by_layer: Mapping[int, Tensor], lengths: Tensor, num_layers: int, budget: float,
                   criterion: str = "entropy") -> float:
    """The strictest threshold whose mean encoder cost on this (development) set is <= `budget`.

    Sweeps every utterance score of every non-final head as a candidate (cost is monotone in the
    threshold), plus a threshold that never exits early. Raises InputError when even exiting every
    utterance at the first head costs more than `budget`.
    """
    layers = _check_layers(log_probs_by_layer, lengths)
    check(0 < budget <= 1, f"budget is a fraction of the encoder's layers in (0, 1], got {budget}")
    scores = torch.stack([utterance_confidence(log_probs_by_layer[k], lengths, criterion) for k in layers])
    never = -1.0 if criterion == "entropy" else 2.0          # entropy >= 0 and probability <= 1: no early exit
    candidates = sorted(set(scores[:-1].flatten().tolist()), reverse=criterion == "max-prob")
    for threshold in [never, *candidates]:                    # strictest first
        if encoder_cost(exit_layers_for(scores, layers, criterion, threshold), num_layers) <= budget + 1e-9:
            return float(threshold)
    raise InputError(f"no threshold meets a budget of {budget:.3f} of the encoder: exiting every utterance at the "
                     f"first head (layer {layers[0]}) already runs {layers[0] / num_layers:.3f}; raise the budget "
                     "or add an earlier exit head")
