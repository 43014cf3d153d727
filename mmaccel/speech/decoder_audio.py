"""What the Whisper decoder attends to: the encoded audio of a batch and the cross-attention keys/values
over it, computed once per utterance and shared by every decoder view that reads the same layers."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mmaccel.errors import check
from mmaccel.speech.timestamps import TimestampRules


@dataclass
class EncodedAudio:
    """What `prefill` takes: encoder states [W, S, d] and the decoder prompt [B, P] (same P per row).

    Cross-attention keys/values are cached here per layer, so a draft that shares the encoder (an
    early-exit view) does not recompute them. Each window's states serve `group` consecutive rows
    (B = W * group; `repeat`): the samples of the temperature fallback attend to one copy of their
    window's keys/values, read once per step for all of them (at batch 8 on a CPU the cross-attention
    reads are a third of a step).
    """

    encoder_states: Tensor
    prompt: Tensor
    cross_kv: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict, repr=False)
    features: Tensor | None = field(default=None, repr=False)   # the log-mels (for an assistant's own encoder)
    # [B] encoder frames that hold audio (the rest of the 30-s window is padding), when known
    audio_frames: Tensor | None = None
    windows: dict = field(default_factory=dict, repr=False)      # cached cross-attention windows (see audio_window)
    rules: TimestampRules | None = None     # timestamp mode: the rules every decoder pass applies
    group: int = 1                          # consecutive rows that share a window's states
    # how each cross_kv entry is computed (its key/value projection, heads, head size): `take_row` computes a
    # joining row's entries alike
    projections: dict = field(default_factory=dict, repr=False)
    sources: dict = field(default_factory=dict, repr=False)      # row -> the audio it took (`take_row`)

    @property
    def batch_size(self) -> int:
        return self.encoder_states.shape[0] * self.group

    def repeat(self, n: int) -> EncodedAudio:
        """Each row `n` times in a row (rows r * n ... r * n + n - 1 are row r's), sharing its states (the
        log-mels, for an assistant's own encoder, are not carried over)."""
        check(self.group == 1, "repeat takes audio with a window per row")
        return EncodedAudio(self.encoder_states, self.prompt.repeat_interleave(n, 0), self.cross_kv,
                            audio_frames=self.audio_frames, windows=self.windows, rules=self.rules, group=n,
                            projections=self.projections)

    def window_of(self, row: int) -> int:
        """The index of row `row`'s window in `encoder_states`."""
        return row // self.group

    def cross_keys_values(self, key: int, project: Callable[[Tensor], tuple[Tensor, Tensor]], num_heads: int,
                          head_dim: int) -> tuple[Tensor, Tensor]:
        """The keys/values [B, H, S, Dh] of cross-attention entry `key` over the whole window, computed once and
        kept under `key` (the decoder's `cross_layers` entry). `project`: states [B, S, d] -> keys, values
        [B, S, H * Dh], used unless the entry already has one (`projections`: the target registers its own at
        `encode`, so a draft that shares the entry reads what the target's precision computes)."""
        if key not in self.cross_kv:
            project, num_heads, head_dim = self.projections.setdefault(key, (project, num_heads, head_dim))
            x = self.encoder_states
            B, S, _ = x.shape
            k, v = project(x)
            self.cross_kv[key] = tuple(t.contiguous().view(B, S, num_heads, head_dim).transpose(1, 2) for t in (k, v))
        return self.cross_kv[key]

    def row_view(self, row: int) -> EncodedAudio:
        """Row `row` as audio of its own that shares this audio's tensors (its cross-attention entries too, so
        a pass over it computes none): valid until the row takes another window (`take_row`)."""
        check(self.group == 1, "row_view takes audio with a window per row")
        one = slice(row, row + 1)
        return EncodedAudio(self.encoder_states[one], self.prompt[one],
                            {key: (k[one], v[one]) for key, (k, v) in self.cross_kv.items()},
                            None if self.features is None else self.features[one],
                            None if self.audio_frames is None else self.audio_frames[one], rules=self.rules,
                            projections=dict(self.projections))

    def take_row(self, row: int, other: EncodedAudio) -> None:
        """Row `row` becomes the one row of `other` (a window that joins a call in progress: continuous batching):
        its encoder states, prompt, audio frames and every cross-attention entry computed so far (computed for
        `other` alike, and kept there for its own prefill). Taking the same audio twice does nothing (a draft that
        shares these states admits the row after the target)."""
        check(self.group == 1 and other.batch_size == 1, "take_row takes one row into audio with a window per row")
        check(other.prompt.shape[1] == self.prompt.shape[1] and other.rules is self.rules,
              "a joining window needs a prompt of the call's length and the call's timestamp rules")
        if self.sources.get(row) is other:
            return
        self.encoder_states[row] = other.encoder_states[0]
        self.prompt[row] = other.prompt[0]
        if self.audio_frames is not None:
            check(other.audio_frames is not None, "a joining window needs its audio length, as the call's rows have")
            self.audio_frames[row] = other.audio_frames[0]
        if self.features is not None and other.features is not None:
            self.features[row] = other.features[0]
        for key, (k, v) in self.cross_kv.items():
            joining_k, joining_v = other.cross_keys_values(key, *self.projections[key])
            k[row], v[row] = joining_k[0], joining_v[0]
        self.windows.clear()        # the cut keys/values are cut again at the next pass
        self.sources[row] = other

    def audio_window(self, key: int, extra: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Keys/values `k`, `v` [B, H, S, Dh] of entry `key` over each row's `audio_frames` plus `extra`
        more: cut to the longest row, with a mask [B, 1, 1, S'] (None: every row reaches that far); cached."""
        # kept in the keys' own dtype: on a CPU, torch's attention kernel runs a one-token query over
        # bf16 keys/values 7x slower than over fp32 ones (0.37 against 0.05 ms for 405 frames)
        name = (key, extra)
        if name not in self.windows:
            reach = (self.audio_frames + extra).clamp(max=k.shape[2])
            n = int(reach.max())
            mask = None
            if bool((reach < n).any()):
                mask = (torch.arange(n)[None, :] < reach[:, None])[:, None, None].to(k.device)
            self.windows[name] = (k[:, :, :n].contiguous(), v[:, :, :n].contiguous(), mask)
        return self.windows[name]

    def select_rows(self, index: Tensor, device: torch.device) -> EncodedAudio:
        """Rows `index` [B'] of this audio, in that order (beam search), with the encoder states and the
        cross-attention keys/values on `device` (one copy per row); the cached windows are not carried over."""
        if self.group > 1:
            index = index.cpu() // self.group
            audio = EncodedAudio(self.encoder_states, self.prompt[:: self.group], self.cross_kv, self.features,
                                 self.audio_frames, rules=self.rules, projections=self.projections)
            return audio.select_rows(index, device)
        idx = index.to(device)
        return EncodedAudio(
            self.encoder_states.index_select(0, idx), self.prompt.index_select(0, index.cpu()),
            {i: (k.index_select(0, idx), v.index_select(0, idx)) for i, (k, v) in self.cross_kv.items()},
            None if self.features is None else self.features.index_select(0, index.to(self.features.device)),
            None if self.audio_frames is None else self.audio_frames.index_select(0, index.cpu()), rules=self.rules,
            projections=dict(self.projections))


    @staticmethod
    def concat(parts: list[EncodedAudio]) -> EncodedAudio:
        """The rows of `parts` (one rules, one prompt length) as one batch; cached keys/values are not carried over."""
        frames = [p.audio_frames for p in parts]
        features = [p.features for p in parts]
        return EncodedAudio(torch.cat([p.encoder_states for p in parts]), torch.cat([p.prompt for p in parts]),
                            features=None if any(f is None for f in features) else torch.cat(features),
                            audio_frames=None if any(f is None for f in frames) else torch.cat(frames),
                            rules=parts[0].rules, projections=dict(parts[0].projections))


def audio_frames(seconds: float, window_s: float, encoder_frames: int) -> int:
    """How many of the `encoder_frames` of a `window_s`-second window hold `seconds` of audio."""
    return min(encoder_frames, math.ceil(seconds / window_s * encoder_frames))
