"""The joint training of the CTC exit heads: batches of feature windows, the heads' summed CTC losses,
resumable AdamW steps, and starting from a saved model's heads (`mmaccel.speech.ctc.train`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.errors import InputError, check
from mmaccel.speech.ctc.whisper_ctc import WhisperCTC
from mmaccel.speech.train.common import optimizer_step, warmup_cosine


def collate(windows: Sequence[dict], layers: Sequence[int]) -> tuple[dict[int, Tensor], Tensor, Tensor, Tensor]:
    """hidden {layer: [B, T, d] fp32, zero-padded}, lengths [B], targets [sum L] (concatenated labels),
    target lengths [B]."""
    lengths = torch.tensor([w["hidden"][layers[0]].shape[0] for w in windows])
    T = int(lengths.max())
    hidden = {k: torch.stack([F.pad(w["hidden"][k].float(), (0, 0, 0, T - w["hidden"][k].shape[0])) for w in windows])
              for k in layers}
    targets = torch.cat([w["labels"].long() for w in windows])
    return hidden, lengths, targets, torch.tensor([len(w["labels"]) for w in windows])


def ctc_losses(heads: nn.ModuleDict, batch: tuple[dict[int, Tensor], Tensor, Tensor, Tensor]) -> dict[int, Tensor]:
    """{layer: mean CTC loss (per target label, as `reduction="mean"`) of the head at that layer}."""
    hidden, lengths, targets, target_lengths = batch
    out = {}
    for key, head in heads.items():
        k = int(key)
        log_probs = head(hidden[k], lengths).float().log_softmax(-1).transpose(0, 1)          # [T', B, V]
        out[k] = F.ctc_loss(log_probs, targets, head.out_lengths(lengths), target_lengths, blank=0, zero_infinity=True)
    return out


def train_heads(heads: nn.ModuleDict, windows: Sequence[dict], *, steps: int, batch_size: int = 8, lr: float = 1e-3,
                warmup: int = 200, weight_decay: float = 0.01, seed: int = 0, checkpoint: Path | None = None,
                checkpoint_every: int = 200, log_every: int = 20,
                log: Callable[[str], None] = print) -> list[dict[int, float]]:
    """Train every head jointly on `windows` ({"hidden": {layer: [T, d]}, "labels": [L]}) with the sum of
    their CTC losses; returns each step's loss per head. With `checkpoint`, the state is saved there
    every `checkpoint_every` steps and at the end, and training resumes from it when it exists."""
    check(len(windows) > 0 and steps >= 1 and batch_size >= 1,
          "train_heads needs windows, steps >= 1 and batch_size >= 1")
    layers = sorted(int(k) for k in heads)
    params = list(heads.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)
    sched = warmup_cosine(opt, steps, max(warmup, 1))
    gen = torch.Generator().manual_seed(seed)
    history: list[dict[int, float]] = []
    start = 0
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint)
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["schedule"])
        gen.set_state(state["sampler_rng"])
        torch.set_rng_state(state["torch_rng"])
        start, history = state["step"], state["history"]
        log(f"train: resumed from {checkpoint} at step {start}/{steps}")
        if state.get("steps", steps) != steps:
            log(f"train: the checkpoint was made for {state['steps']} steps; the cosine schedule now ends at {steps}")
    heads.train()
    t0 = time.time()
    for step in range(start, steps):
        pick = torch.randint(len(windows), (batch_size,), generator=gen).tolist()
        losses = ctc_losses(heads, collate([windows[i] for i in pick], layers))
        optimizer_step(opt, sched, sum(losses.values()), params)
        history.append({k: float(v.detach()) for k, v in losses.items()})
        if checkpoint is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == steps):
            state = {"heads": heads.state_dict(), "optimizer": opt.state_dict(), "schedule": sched.state_dict(),
                     "sampler_rng": gen.get_state(), "torch_rng": torch.get_rng_state(), "step": step + 1,
                     "steps": steps, "history": history}
            tmp = checkpoint.with_suffix(".tmp")
            torch.save(state, tmp)
            tmp.replace(checkpoint)
        if log_every and ((step + 1) % log_every == 0 or step + 1 == steps):
            recent = history[-log_every:]
            means = "  ".join(f"L{k} {np.mean([h[k] for h in recent]):.3f}" for k in layers)
            log(f"train: step {step + 1}/{steps}  ctc {means}  lr {sched.get_last_lr()[0]:.2e}  "
                f"{(time.time() - t0) / (step + 1 - start):.2f} s/step")
    heads.eval()
    return history


def init_heads(ctc: WhisperCTC, path: Path) -> None:
    """Load the heads of the saved model at `path` into `ctc` (the same exit layers and sizes). A head
    with stride s > 1 starting from a stride-1 one gets the input projection tiled s times over 1 / s:
    at first it reads the mean of its s frames."""
    from safetensors.torch import load_file

    from mmaccel.speech.ctc.whisper_ctc import HEADS_FILE

    file = path / HEADS_FILE
    if not file.is_file():
        raise InputError(f"--init {path}: no {HEADS_FILE} there")
    tensors = {k: v.float() for k, v in load_file(str(file)).items()}
    own = ctc.heads.state_dict()
    for name, value in tensors.items():
        want = own.get(name)
        if name.endswith(".proj.weight") and want is not None and want.shape != value.shape \
                and want.shape[1] % value.shape[1] == 0:
            stride = want.shape[1] // value.shape[1]
            tensors[name] = value.repeat(1, stride) / stride
    try:
        ctc.heads.load_state_dict(tensors)
    except RuntimeError as err:
        raise InputError(f"--init {path} does not fit these heads: {str(err).splitlines()[0]}") from None
