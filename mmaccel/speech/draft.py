"""A small same-tokenizer draft decoder for a Whisper model (the distil-whisper recipe), and its file.

The draft is a Hugging Face `WhisperForCausalLM` (what `generate(assistant_model=...)` takes, so
HF's assisted generation runs the very same draft) with a few decoder layers initialised from
target layers `layers` (distil-whisper keeps the first and the last). It shares the target's token
and position embeddings (frozen; the vocabulary projection is tied to them) and reads the target's
encoder states. Its cross-attention key/value projections stay frozen copies of the source layers,
so in our decoder the draft reads the target's cross-attention cache entries
(`WhisperDecoderModel(cross_layers=...)`) and costs nothing extra per utterance.

Trained by self-distillation on the target's own greedy transcripts
(`mmaccel.speech.train.draft`). Drafting reads out through a vocabulary shortlist (the tokens of
the training transcripts), like the heads of `mmaccel.speech.heads`.

File: safetensors with the trained tensors only (self-attention, cross-attention query/output,
MLP and norms of each layer, the final norm; fp16) and the shortlist `vocab`; metadata names the
target (hidden size, vocabulary, decoder layers), the source layers, the cross-attention window and
whether it was trained on timestamp-mode transcripts (`timestamps`).

Two things make the draft cheap to run on a CPU, where a decoding step is bound by memory traffic:
it cross-attends only to the frames that hold audio plus `cross_window` frames after them (it is
trained that way; Whisper pads every clip to 30 s and the full model attends to all 1 500 frames),
and for decoding its layers and shortlist run on int8 weights (`decoder_model(quantized=True)`).
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from mmaccel.checkpoints import read_checkpoint
from mmaccel.errors import InputError, check
from mmaccel.speech.decoder import ShortlistProjection, WhisperDecoderModel

FROZEN = ("encoder_attn.k_proj.", "encoder_attn.v_proj.")   # per layer: shared with the source layer


@dataclass
class WhisperDraft:
    hf: torch.nn.Module        # a WhisperForCausalLM sharing the target's embeddings
    layers: list[int]            # the target layer each draft layer was initialised from
    vocab: Tensor | None = None  # the draft shortlist (token ids)
    cross_window: int | None = None  # frames after the audio it cross-attends to (None: the whole window)
    # trained on timestamp-mode transcripts too, so it reads and drafts timestamp tokens; a draft trained without
    # them reads every timestamp as <|notimestamps|> (`WhisperDecoderModel.as_read`)
    timestamps: bool = False

    def decoder_model(self, target: WhisperDecoderModel, quantized: bool = False) -> WhisperDecoderModel:
        """The draft as a DecoderModel: the target's decoding rules, its cross-attention cache
        entries, logits through the shortlist. `quantized`: its layers and shortlist run on int8
        copies of the weights (this draft's own modules stay as they are). An all-bf16 copy was
        measured slower here at one row: oneDNN's bf16 products of one row are no faster than fp32
        ones, and torch's attention over bf16 keys/values is slower than over fp32 ones."""
        projection = None
        if self.vocab is not None:
            projection = ShortlistProjection(target.decoder.embed_tokens.weight, self.vocab, quantized=quantized)
        model = target._same_switches(WhisperDecoderModel(
            self.hf, target.suppress_tokens, target.begin_suppress_tokens, cross_layers=self.layers,
            projection=projection, cross_window=self.cross_window, quantized=quantized))
        model.reads_timestamps_as_none = not self.timestamps
        return model


def new_draft(target_hf, layers: list[int] | tuple[int, ...] = (0, -1), cross_window: int | None = None) -> WhisperDraft:
    """A draft decoder initialised from the target's `layers` (negative counts from the end),
    cross-attending to the audio frames plus `cross_window` (None: the whole 30-s window)."""
    source = target_hf.model.decoder
    total = len(source.layers)
    check(len(layers) >= 1, "a draft needs at least one decoder layer")
    picked = [k % total if -total <= k < total else k for k in layers]
    check(all(0 <= k < total for k in picked) and len(set(picked)) == len(picked),
          f"draft layers must be distinct target layers in [{-total}, {total - 1}], got {list(layers)}")
    config = copy.deepcopy(target_hf.config)
    config.decoder_layers = len(picked)
    config.is_encoder_decoder = False
    layers = torch.nn.ModuleList(copy.deepcopy(source.layers[k]) for k in picked)
    for j, layer in enumerate(layers):             # HF attention modules index their cache by layer_idx
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = j
    draft = _assemble(config, source, layers, copy.deepcopy(source.layer_norm))
    draft.generation_config = copy.deepcopy(target_hf.generation_config)
    check(cross_window is None or (isinstance(cross_window, int) and cross_window >= 0),
          f"cross_window must be None or an int >= 0 (frames), got {cross_window!r}")
    return WhisperDraft(draft, picked, cross_window=cross_window)


def _assemble(config, source_decoder, layers: torch.nn.ModuleList, layer_norm: torch.nn.Module):
    """A WhisperForCausalLM of `layers` + `layer_norm` on the target decoder's embeddings (shared:
    the vocabulary projection is tied to them); built on the meta device, so nothing vocabulary-sized
    is allocated."""
    from transformers import WhisperForCausalLM

    with torch.device("meta"):
        draft = WhisperForCausalLM(config)
    decoder = draft.model.decoder
    decoder.embed_tokens, decoder.embed_positions = source_decoder.embed_tokens, source_decoder.embed_positions
    decoder.layers, decoder.layer_norm = layers, layer_norm
    draft.proj_out.weight = source_decoder.embed_tokens.weight
    return draft.eval()


def trainable(draft: WhisperDraft) -> dict[str, torch.nn.Parameter]:
    """The draft's own parameters: its layers and final norm, minus the shared cross-attention K/V."""
    decoder = draft.hf.model.decoder
    named = {f"layers.{n}": p for n, p in decoder.layers.named_parameters()}
    named.update({f"layer_norm.{n}": p for n, p in decoder.layer_norm.named_parameters()})
    return {n: p for n, p in named.items() if not any(f in n for f in FROZEN)}


def _signature(target_hf) -> dict:
    cfg = target_hf.config
    return {"hidden_size": cfg.d_model, "vocab_size": cfg.vocab_size, "decoder_layers": cfg.decoder_layers}


def save_draft(path: str | os.PathLike, target_hf, draft: WhisperDraft, info: dict | None = None) -> Path:
    """Write the draft's own weights (fp16) and shortlist to a `.safetensors` file whose header names the
    target decoder, the layers and the cross window (`load_draft` reads them back)."""
    from safetensors.torch import save_file

    check(Path(path).suffix == ".safetensors", f"a Whisper draft decoder is saved as .safetensors, got {path}")
    tensors = {n: p.detach().half().contiguous() for n, p in trainable(draft).items()}
    if draft.vocab is not None:
        tensors["vocab"] = draft.vocab.to(torch.int64).contiguous()
    meta = {"model": _signature(target_hf), "layers": draft.layers, "cross_window": draft.cross_window,
            "timestamps": draft.timestamps, "info": info or {}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"mmaccel_whisper_draft": json.dumps(meta)})
    return path


def load_draft(path: str | os.PathLike, target_hf) -> WhisperDraft:
    """The draft in `path` for `target_hf`; a clear error if missing, corrupt or for another model."""
    tensors, metadata = read_checkpoint(path, "Whisper draft decoder file")
    raw = metadata.get("mmaccel_whisper_draft")
    if raw is None:
        raise InputError(f"{path} has no mmaccel_whisper_draft metadata; it is not a Whisper draft decoder file")
    meta = json.loads(raw)
    if meta["model"] != _signature(target_hf):
        raise InputError(f"{path} holds a draft for a Whisper decoder with {meta['model']}, "
                         f"but this model has {_signature(target_hf)}")
    draft = new_draft(target_hf, meta["layers"], meta.get("cross_window"))
    draft.vocab = tensors.pop("vocab", None)
    draft.timestamps = bool(meta.get("timestamps", False))
    own = trainable(draft)
    missing, unexpected = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    if missing or unexpected:
        raise InputError(f"{path}: draft tensors do not match; missing {missing[:5]}, unexpected {unexpected[:5]}")
    bad = [n for n, p in own.items() if p.shape != tensors[n].shape]
    check(not bad, f"{path}: wrong shapes for {bad[:5]}")
    with torch.no_grad():
        for n, p in own.items():
            p.copy_(tensors[n].to(p.dtype))
    target_dtype = target_hf.model.decoder.embed_tokens.weight.dtype
    draft.hf.to(target_dtype).requires_grad_(False)
    return draft
