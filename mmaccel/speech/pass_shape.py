"""Whisper's decoder pass by width, as adaptive drafting reads it (`mmaccel.engine.pass_costs`).

The pass is timed as decoding meets it: `rows` rows of a 30-s window (encoder states of zeros: a pass's cost does
not depend on their values, and no encoder runs), each with its own cross-attention keys/values, the prompt and
filler text up to `KV_LEN` cache entries, in timestamp mode when decoding is (its rules run every pass).
"""

from __future__ import annotations

import torch

from mmaccel.core.model import DecodeState
from mmaccel.engine.measured import fingerprint
from mmaccel.engine.pass_costs import KV_LEN, WIDTHS, WidthCosts, width_costs
from mmaccel.speech.decoder import WhisperDecoderModel
from mmaccel.speech.timestamps import TimestampRules

FILLER = 440        # an ordinary text token (" the"-like in Whisper's vocabularies)


def filled_state(model: WhisperDecoderModel, prompt: list[int], rows: int, kv_len: int = KV_LEN,
                 rules: TimestampRules | None = None, room: int = 64) -> DecodeState:
    """A decode state of `rows` rows holding `prompt` and filler text up to `kv_len` cache entries."""
    cfg = model.hf.config
    states = torch.zeros(1, cfg.max_source_positions, cfg.d_model, dtype=model.dtype, device=model.device)
    inputs = model.encoded(states, prompt, rules=rules).select_rows(torch.zeros(rows, dtype=torch.long), model.device)
    state = model.prefill(inputs, room)
    model.step(state, torch.full((rows, kv_len - len(prompt)), filler(model), device=model.device))
    return state


def filler(model: WhisperDecoderModel) -> int:
    return FILLER if model.hf.config.vocab_size > FILLER else 1


def filler_pass(model: WhisperDecoderModel, state: DecodeState, width: int) -> None:
    """One pass of `width` filler tokens on every row of `state`, rolled back (the state holds what it held)."""
    model.step(state, torch.full((state.batch_size, width), filler(model), device=model.device))
    state.rollback(width)


def whisper_width_costs(model: WhisperDecoderModel, prompt: list[int], rows: int,
                        rules: TimestampRules | None = None) -> WidthCosts:
    """`model`'s pass at each width at batch `rows` (measured once per machine and model, then cached)."""
    state = filled_state(model, prompt, rows, rules=rules, room=KV_LEN + max(WIDTHS) + 8)
    key = {"pass": "whisper-decoder", "model": fingerprint(model.hf), "quantized": model.quantized,
           "argmax": model.argmax_readout is not None, "fixed_shape": model.fixed_shape, "rows": rows,
           "prompt": len(prompt), "timestamps": rules is not None}
    return width_costs(lambda width: filler_pass(model, state, width), key)
