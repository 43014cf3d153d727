"""Training windows of the CTC heads: consecutive utterances packed into windows of up to `window_s`
seconds, each encoded once, their exit-layer states kept in feature shards (`mmaccel.speech.ctc.train`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from mmaccel.errors import check
from mmaccel.speech.audio import SAMPLE_RATE, Audio
from mmaccel.speech.ctc.whisper_ctc import WhisperCTC, encode_variable, log_mel_variable
from mmaccel.speech.data import Utterance


def plan_windows(durations: Sequence[float], window_s: float, gap_s: float) -> list[list[int]]:
    """Pack consecutive utterances (by index, in the given order) into windows of at most `window_s`
    seconds including `gap_s` between neighbours; an utterance longer than a window gets its own."""
    windows, current, length = [], [], 0.0
    for i, d in enumerate(durations):
        extra = d + (gap_s if current else 0.0)
        if current and length + extra > window_s:
            windows.append(current)
            current, length, extra = [], 0.0, d
        current.append(i)
        length += extra
    if current:
        windows.append(current)
    return windows


def pack(samples: Sequence[np.ndarray], gap_s: float) -> np.ndarray:
    """The clips one after another with `gap_s` seconds of silence between them."""
    gap = np.zeros(int(round(gap_s * SAMPLE_RATE)), dtype=np.float32)
    parts = [p for i, s in enumerate(samples) for p in ((gap, s) if i else (s,))]
    return np.concatenate(parts).astype(np.float32)


def window_plan(utterances: Sequence[Utterance], copies: int, window_s: float, gap_s: float,
                seed: int) -> list[tuple[int, list[int]]]:
    """(copy, utterance indices) of every window: copy 0 in corpus order, later copies shuffled."""
    out = []
    for copy in range(copies):
        order = np.arange(len(utterances)) if copy == 0 else \
            np.random.default_rng([seed, copy]).permutation(len(utterances))
        for window in plan_windows([utterances[i].duration for i in order], window_s, gap_s):
            out.append((copy, [int(order[i]) for i in window]))
    return out


@torch.inference_mode()
def encode_windows(ctc: WhisperCTC, items: list[dict], batch: int) -> list[dict]:
    """{"hidden": {layer: fp16 [T, d]}} of each window (`items[i]["samples"]`), encoded `batch` at a time
    (longest first, so a batch pads little)."""
    order = sorted(range(len(items)), key=lambda i: -len(items[i]["samples"]))
    rows: list[dict] = [{} for _ in items]
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        features, frames = log_mel_variable(ctc.feature_extractor, [Audio(items[i]["samples"]) for i in idx])
        hidden, lengths = encode_variable(ctc.encoder, features, frames, ctc.exit_layers)
        for b, i in enumerate(idx):
            n = int(lengths[b])
            rows[i]["hidden"] = {k: hidden[k][b, :n].to("cpu", torch.float16).clone() for k in ctc.exit_layers}
    return rows


def load_windows(folders: Sequence[Path], exit_layers: Sequence[int]) -> list[dict]:
    """Every window of every shard in `folders` (hidden states of `exit_layers`, labels), folder by folder."""
    windows = []
    for folder in folders:
        paths = sorted(Path(folder).glob("shard_*.pt"))
        check(len(paths) > 0, f"no feature shards in {folder}: run the features stage first")
        for path in paths:
            shard = torch.load(path)
            check(sorted(shard["exit_layers"]) == sorted(exit_layers), f"{path} holds layers "
                  f"{shard['exit_layers']}, the heads are at {list(exit_layers)}")
            windows += [{"hidden": w["hidden"], "labels": w["labels"]} for w in shard["windows"]]
    return windows
