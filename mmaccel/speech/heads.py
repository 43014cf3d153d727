"""Trained draft heads for a Whisper decoder: Medusa heads and early-exit heads, and their files.

Medusa heads (the Medusa-Linear design of Whisper-Medusa, without its lossy base-head block):
head i is a residual SiLU block on the decoder's final hidden state, read out through the model's
tied vocabulary projection, and guesses the token i + 2 places after that state's position. Exit
heads (`ExitHead`) turn the output of decoder layer k into next-token logits through the same
projection. Both leave the model untouched, so verification against the full model is exact.

Drafting reads out through a shortlist of the vocabulary (the tokens of the training transcripts,
stored with the heads as `vocab`): the full 51 865-row projection per head would cost more than
the passes Medusa saves on a CPU.

One safetensors file holds every kind (weights stored in fp16 and loaded in the model's dtype:
drafts only propose, so their rounding never reaches the output); its metadata names the model
they were trained for (hidden size, vocabulary, decoder layers), and loading checks that they fit.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from mmaccel.checkpoints import read_checkpoint
from mmaccel.core.proposers import MedusaHead
from mmaccel.core.readout import project
from mmaccel.errors import InputError, check
from mmaccel.speech.decoder import ExitHead, ShortlistProjection, WhisperDecoderModel
from mmaccel.speech.draft import trainable
from mmaccel.speech.eagle import EagleHead, new_eagle_head
from mmaccel.speech.medusa_block import MedusaBlock, new_medusa_block


@dataclass
class WhisperHeads:
    medusa: nn.ModuleList | None = None          # heads[i] guesses the token i + 2 ahead of the hidden state
    exits: dict[int, ExitHead] | None = None     # exit layer -> head
    vocab: Tensor | None = None                  # the draft shortlist (token ids) the heads project onto
    block: MedusaBlock | None = None           # Medusa-Block heads (mmaccel.speech.medusa_block)
    eagle: EagleHead | None = None             # an EAGLE head (mmaccel.speech.eagle)


def head_projection(model: WhisperDecoderModel, vocab: Tensor | None = None):
    """The tied vocabulary projection, over the shortlist `vocab` when given."""
    weight = model.decoder.embed_tokens.weight
    if vocab is not None:
        check(vocab.dim() == 1 and len(vocab) > 0 and int(vocab.min()) >= 0 and int(vocab.max()) < model.vocab_size,
              f"the head shortlist must be token ids in [0, {model.vocab_size})")
        return ShortlistProjection(weight, vocab)
    return lambda hidden: project(hidden, weight)


def new_medusa_heads(model: WhisperDecoderModel, num_heads: int, num_layers: int = 1,
                     vocab: Tensor | None = None) -> nn.ModuleList:
    check(isinstance(num_heads, int) and 1 <= num_heads <= 16, f"num_heads must be in [1, 16], got {num_heads!r}")
    project = head_projection(model, vocab)
    return nn.ModuleList(MedusaHead(model.hidden_size, model.vocab_size, num_layers, project) for _ in range(num_heads))


def new_exit_heads(model: WhisperDecoderModel, layers: list[int], vocab: Tensor | None = None) -> dict[int, ExitHead]:
    total = len(model.decoder.layers)
    for k in layers:
        check(isinstance(k, int) and 1 <= k < total, f"exit layers must lie in [1, {total - 1}], got {k!r}")
    heads = {k: ExitHead(model.decoder.layer_norm) for k in layers}
    if vocab is not None:
        projection = head_projection(model, vocab)
        for head in heads.values():
            head.projection = projection
    return heads


def _signature(model: WhisperDecoderModel) -> dict:
    return {"hidden_size": model.hidden_size, "vocab_size": model.vocab_size, "decoder_layers": len(model.decoder.layers)}


def save_heads(path: str | os.PathLike, model: WhisperDecoderModel, heads: WhisperHeads, info: dict | None = None) -> Path:
    """Write `heads` (fp16 weights) to a `.safetensors` file whose header names the decoder and the head
    sizes (`load_heads` reads them back)."""
    from safetensors.torch import save_file

    check(Path(path).suffix == ".safetensors", f"Whisper heads are saved as .safetensors, got {path}")
    tensors, meta = {}, {"model": _signature(model), "info": info or {}}
    if heads.medusa is not None:
        meta["medusa"] = {"num_heads": len(heads.medusa), "num_layers": len(heads.medusa[0].blocks)}
        for name, t in heads.medusa.state_dict().items():
            tensors[f"medusa.{name}"] = t.detach().half().contiguous()
    if heads.block is not None:
        meta["medusa_block"] = {"num_heads": len(heads.block.heads), "num_layers": len(heads.block.heads[0].blocks)}
        for name, t in trainable(heads.block.layer).items():
            tensors[f"block.layer.{name}"] = t.detach().half().contiguous()
        for name, t in heads.block.heads.state_dict().items():
            tensors[f"block.heads.{name}"] = t.detach().half().contiguous()
    if heads.eagle is not None:
        meta["eagle"] = {"cross_window": heads.eagle.layer.cross_window, "layers": list(heads.eagle.layer.layers),
                         "feature_layers": list(heads.eagle.feature_layers), "timestamps": heads.eagle.layer.timestamps}
        if heads.eagle.fuse is not None:
            for name, t in heads.eagle.fuse.state_dict().items():
                tensors[f"eagle.fuse.{name}"] = t.detach().half().contiguous()
        if heads.eagle.start is not None:
            tensors["eagle.start"] = heads.eagle.start.detach().float().contiguous()
        for name, t in trainable(heads.eagle.layer).items():
            tensors[f"eagle.layer.{name}"] = t.detach().half().contiguous()
        for name, t in heads.eagle.fc.state_dict().items():
            tensors[f"eagle.fc.{name}"] = t.detach().half().contiguous()
        if heads.eagle.layer.vocab is not None:            # its own shortlist (from its training transcripts)
            tensors["eagle.vocab"] = heads.eagle.layer.vocab.to(torch.int64).clone()
    if heads.exits:
        meta["exit_layers"] = sorted(heads.exits)
        for k, head in heads.exits.items():
            for name, t in head.state_dict().items():
                tensors[f"exit.{k}.{name}"] = t.detach().half().contiguous()
    check(tensors, "no heads to save")
    if heads.vocab is not None:
        tensors["vocab"] = heads.vocab.to(torch.int64).contiguous()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"mmaccel_whisper_heads": json.dumps(meta)})
    return path


def load_heads(path: str | os.PathLike, model: WhisperDecoderModel) -> WhisperHeads:
    """Heads from `path` for `model`; a clear error if the file is missing, corrupt or for another model."""
    tensors, metadata = read_checkpoint(path, "Whisper heads file")
    raw = metadata.get("mmaccel_whisper_heads")
    if raw is None:
        raise InputError(f"{path} has no mmaccel_whisper_heads metadata; it is not a Whisper heads file")
    meta = json.loads(raw)
    want = _signature(model)
    if meta["model"] != want:
        raise InputError(f"{path} holds heads for a Whisper decoder with {meta['model']}, but this model has {want}")
    heads = WhisperHeads(vocab=tensors.pop("vocab", None))
    if "medusa" in meta:
        m = meta["medusa"]
        heads.medusa = new_medusa_heads(model, m["num_heads"], m["num_layers"], heads.vocab)
        _load_part(heads.medusa, tensors, "medusa.", path)
    if "exit_layers" in meta:
        heads.exits = new_exit_heads(model, meta["exit_layers"], heads.vocab)
        for k, head in heads.exits.items():
            _load_part(head, tensors, f"exit.{k}.", path)
    if "medusa_block" in meta:
        m = meta["medusa_block"]
        heads.block = new_medusa_block(model, new_medusa_heads(model, m["num_heads"], m["num_layers"], heads.vocab))
        heads.block.layer.vocab = heads.vocab
        _load_part(heads.block.heads, tensors, "block.heads.", path)
        _load_layer(heads.block.layer, tensors, "block.layer.", path, "the Medusa block")
    if "eagle" in meta:
        m = meta["eagle"]
        start = tensors.pop("eagle.start", None)
        heads.eagle = new_eagle_head(model, m["cross_window"], tuple(m.get("layers", (-1,))), start is not None,
                                     tuple(m.get("feature_layers", ())))
        heads.eagle.layer.vocab = tensors.pop("eagle.vocab", None)
        heads.eagle.layer.timestamps = bool(m.get("timestamps", False))
        if start is not None:
            check(start.shape == heads.eagle.start.shape, f"{path}: the EAGLE head's start feature has shape "
                  f"{tuple(start.shape)}, not {tuple(heads.eagle.start.shape)}")
            heads.eagle.start = start.to(model.device, model.dtype)
        _load_layer(heads.eagle.layer, tensors, "eagle.layer.", path, "the EAGLE head")
        _load_part(heads.eagle.fc, tensors, "eagle.fc.", path)
        if heads.eagle.fuse is not None:
            _load_part(heads.eagle.fuse, tensors, "eagle.fuse.", path)
    for module in [*(heads.medusa or []), *(heads.exits or {}).values(), *(heads.block.heads if heads.block else [])]:
        module.to(model.device, model.dtype).eval().requires_grad_(False)
    for layer in (heads.block.layer if heads.block else None, heads.eagle.layer if heads.eagle else None):
        if layer is not None:
            layer.hf.requires_grad_(False)
    if heads.eagle is not None:
        for part in (heads.eagle.fc, heads.eagle.fuse):
            if part is not None:
                part.to(model.device, model.dtype).eval().requires_grad_(False)
    return heads


def merge_heads(parts: list[WhisperHeads], names: list[str]) -> WhisperHeads:
    """One set of heads from several files (`names` for messages), each kind from one file only;
    the shortlist `vocab` is that of the file with the Medusa / exit / block heads."""
    out, owner = WhisperHeads(), {}
    for heads, name in zip(parts, names):
        for kind in ("medusa", "exits", "block", "eagle"):
            if getattr(heads, kind):
                check(kind not in owner, f"{owner.get(kind)} and {name} both carry {kind} heads; load one of them")
                owner[kind] = name
                setattr(out, kind, getattr(heads, kind))
        if heads.vocab is not None and (heads.medusa is not None or heads.exits or heads.block is not None):
            out.vocab = heads.vocab
    return out


def _load_layer(draft, tensors: dict, prefix: str, path: Path, what: str) -> None:
    """Copy the `prefix` tensors into a draft's own parameters (copies of the target's layers)."""
    own = trainable(draft)
    part = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    check(set(part) == set(own) and all(own[k].shape == part[k].shape for k in own),
          f"{path}: {what}'s tensors do not match copies of this model's decoder layers")
    with torch.no_grad():
        for k, p in own.items():
            p.copy_(part[k])


def _load_part(module: nn.Module, tensors: dict, prefix: str, path: Path) -> None:
    part = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(part)), sorted(set(part) - set(own))
    if missing or unexpected:
        raise InputError(f"{path}: heads do not match their metadata; missing {missing[:5]}, unexpected {unexpected[:5]}")
    bad = [k for k in own if own[k].shape != part[k].shape]
    check(not bad, f"{path}: wrong shapes for {bad[:5]}")
    module.load_state_dict(part)
