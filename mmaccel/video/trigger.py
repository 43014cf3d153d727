"""Proactive triggers: when a streaming model should speak without being asked again.

A user registers a request ("tell me when a bag appears"); the stream goes on, and the model must say
so at the right frame. VideoLLM-online decides this with its streaming EOS (the probability of the
frame-interval token against a threshold, reference video_core.md A.2); StreamBridge with a decoupled
activation model that emits a binary "respond now" signal through a threshold (A.1). Here the
activation model is a light head on the *frozen* stream model: after each vision segment enters the
cache, `TriggerHead` reads the final hidden states of that segment's vision tokens (the decoder has
already mixed in the whole history held in the cache) and gives per class the probability that an
object of the class is visible at the segment's last frame. Each token is scored by a small MLP and
the scores are max-pooled over the tokens: an object covers a few tokens, and one confident token is
enough; a segment whose tokens were all dropped (`TemporalDrop` on a static screen) shows nothing new,
and every probability is 0.

Firing rule (`TriggerMonitor`), the one `mmaccel.video.data.ask` uses for "when" questions: a request
is about a *new* appearance. A request is armed while its subject's probability is below the
threshold; an armed request fires at the first segment whose probability reaches the threshold, and
is then removed. A request made while its subject is already predicted visible is not armed until the
probability has dropped below the threshold, so it fires only after the subject has gone and come back.

The head is stored next to the model: `trigger.safetensors` (weights) + `trigger.json` (hidden size,
width, classes, threshold); `VideoStreamPipeline.from_pretrained` loads it when present. Train one with
`python -m mmaccel.video.train_trigger`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from mmaccel.errors import InputError, ModelNotFoundError, check

WEIGHTS_FILE, CONFIG_FILE = "trigger.safetensors", "trigger.json"
FORMAT = "mmaccel-trigger-head"
TRAIN_HINT = "train one with `python -m mmaccel.video.train_trigger --model DIR`"


class TriggerHead(nn.Module):
    """Per-class visibility from a segment's vision-token hidden states: an MLP per token
    (hidden_size -> width -> one logit per class), max-pooled over the tokens."""

    def __init__(self, hidden_size: int, classes: Sequence[str], *, width: int = 128, threshold: float = 0.5):
        super().__init__()
        check(isinstance(hidden_size, int) and hidden_size >= 1,
              f"hidden_size must be an int >= 1, got {hidden_size!r}")
        check(isinstance(width, int) and width >= 1, f"width must be an int >= 1, got {width!r}")
        classes = list(classes)
        check(len(classes) >= 1 and all(isinstance(c, str) and c for c in classes),
              f"classes must be a non-empty list of class words, got {classes!r}")
        check(len(set(classes)) == len(classes), f"classes must be distinct, got {classes!r}")
        check(isinstance(threshold, (int, float)) and 0.0 < threshold < 1.0,
              f"threshold must be a probability in (0, 1), got {threshold!r}")
        self.hidden_size, self.width, self.classes, self.threshold = hidden_size, width, classes, float(threshold)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, width), nn.GELU(), nn.Linear(width, len(classes)))

    def token_logits(self, hidden: Tensor) -> Tensor:
        """hidden [..., n, d] -> per-token logits [..., n, C]."""
        check(hidden.shape[-1] == self.hidden_size, f"the trigger head reads hidden states of size {self.hidden_size}, "
              f"got {hidden.shape[-1]}: the head was trained for another model ({TRAIN_HINT})")
        first = self.mlp[0].weight
        return self.mlp(hidden.to(first.device, first.dtype))

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        """hidden [B, n, d] (vision tokens only), mask [B, n] (bool, True = a real token, for padded
        batches) -> logits [B, C], the max over tokens; a row without tokens gets -inf (probability 0)."""
        check(hidden.dim() == 3, f"hidden must be [B, n, d], got {tuple(hidden.shape)}")
        logits = self.token_logits(hidden)                                           # [B, n, C]
        if mask is not None:
            check(mask.shape == hidden.shape[:2], f"mask must be {tuple(hidden.shape[:2])}, got {tuple(mask.shape)}")
            logits = logits.masked_fill(~mask.to(logits.device, torch.bool)[..., None], float("-inf"))
        if logits.shape[1] == 0:
            return logits.new_full((logits.shape[0], len(self.classes)), float("-inf"))
        return logits.amax(1)

    @torch.no_grad()
    def probabilities(self, hidden: Tensor) -> Tensor:
        """One segment's vision-token hidden states [n, d] -> per-class probabilities [C] (float32, host)."""
        check(hidden.dim() == 2, f"hidden must be one segment's [n, d], got {tuple(hidden.shape)}")
        return torch.sigmoid(self(hidden[None])[0].float()).cpu()

    def config(self) -> dict:
        return {"format": FORMAT, "version": 1, "hidden_size": self.hidden_size, "width": self.width,
                "classes": self.classes, "threshold": self.threshold}

    def save(self, directory: str | os.PathLike, **info) -> Path:
        """Write `trigger.safetensors` + `trigger.json` into `directory` (e.g. the model's); extra
        `info` (how it was trained) is kept in the json. Returns the directory."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().float().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(directory / WEIGHTS_FILE))
        config = {**self.config(), **({"info": info} if info else {})}
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=1))
        return directory


def has_trigger(directory: str | os.PathLike) -> bool:
    """Whether `directory` holds a trigger head (either of its two files)."""
    directory = Path(directory)
    return (directory / WEIGHTS_FILE).exists() or (directory / CONFIG_FILE).exists()


def load_trigger(directory: str | os.PathLike, hidden_size: int | None = None) -> TriggerHead:
    """The `TriggerHead` saved in `directory`, in eval mode; `hidden_size` (the model's) is checked."""
    from mmaccel.checkpoints import check_layout, read_checkpoint

    directory = Path(directory)
    weights, config = directory / WEIGHTS_FILE, directory / CONFIG_FILE
    for path in (config, weights):
        if not path.is_file():
            raise ModelNotFoundError(f"{path} is missing: a trigger head is {WEIGHTS_FILE} + {CONFIG_FILE} "
                                     f"({TRAIN_HINT})")
    try:
        cfg = json.loads(config.read_text())
        check(isinstance(cfg, dict) and cfg.get("format") == FORMAT, f"format is not {FORMAT!r}")
        head = TriggerHead(cfg["hidden_size"], cfg["classes"], width=cfg["width"], threshold=cfg["threshold"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, InputError) as e:
        raise InputError(f"{config} is not a trigger head config ({type(e).__name__}: {e}); write it with "
                         f"TriggerHead.save ({TRAIN_HINT})") from None
    if hidden_size is not None and head.hidden_size != hidden_size:
        raise InputError(f"the trigger head in {directory} reads hidden states of size {head.hidden_size}, the model's "
                         f"are {hidden_size}: it was trained for another model ({TRAIN_HINT})")
    state, _ = read_checkpoint(weights, "trigger head")
    check_layout(head.state_dict(), state, str(weights), f"TriggerHead (hidden {head.hidden_size}, width {head.width}, "
                 f"{len(head.classes)} classes)")
    head.load_state_dict(dict(state), strict=True)
    return head.eval()


@dataclass
class TriggerEvent:
    """A request that fired: its subject was seen at `frame` (the last frame of the segment that fired
    it) with `probability`; the request was made after frame `requested_at` (-1: before any frame)."""

    subject: str
    frame: int
    probability: float
    requested_at: int
    request_id: int


@dataclass
class TriggerRequest:
    """A pending request; `armed` once its subject has been seen below threshold (see the module doc)."""

    subject: str
    requested_at: int
    armed: bool
    request_id: int


class TriggerMonitor:
    """The pending requests of one stream and the firing rule. `observe` takes each segment's per-class
    probabilities in stream order; the pipeline feeds it from its `TriggerHead`, threshold selection
    replays recorded probabilities through the same rule."""

    def __init__(self, classes: Sequence[str], threshold: float):
        self.classes, self.threshold = list(classes), float(threshold)
        self.pending: list[TriggerRequest] = []
        self.last: Tensor | None = None        # [C] probabilities of the last observed segment
        self._next_id = 0

    def request(self, subject: str, requested_at: int) -> TriggerRequest:
        if subject not in self.classes:
            raise InputError(f"the trigger head knows no class {subject!r}; it watches for: {', '.join(self.classes)}")
        c = self.classes.index(subject)
        armed = self.last is None or float(self.last[c]) < self.threshold
        req = TriggerRequest(subject, int(requested_at), armed, self._next_id)
        self._next_id += 1
        self.pending.append(req)
        return req

    def observe(self, probabilities: Tensor, frame: int) -> list[TriggerEvent]:
        """probabilities [C] of the segment ending at `frame` -> the requests that fire there (removed)."""
        check(probabilities.shape == (len(self.classes),),
              f"probabilities must be [{len(self.classes)}], got {tuple(probabilities.shape)}")
        self.last = probabilities
        fired, waiting = [], []
        for req in self.pending:
            p = float(probabilities[self.classes.index(req.subject)])
            if p >= self.threshold and req.armed:
                fired.append(TriggerEvent(req.subject, int(frame), p, req.requested_at, req.request_id))
                continue
            req.armed = req.armed or p < self.threshold
            waiting.append(req)
        self.pending = waiting
        return fired
