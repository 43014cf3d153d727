"""LlamaGen class-conditional GPT (FoundationVision/LlamaGen, `autoregressive/models/gpt.py`) as a DecoderModel.

Llama-style decoder (RMSNorm, SwiGLU, fused `wqkv`) over VQ image tokens in raster order, with
one class-embedding token in front and a 2-D rotary embedding: image token i sits at grid cell
(i // grid, i % grid); the first half of each head's rotary pairs encodes the row, the second the
column. As in the official `precompute_freqs_cis_2d`, the class token's rotary entries are
(cos, sin) = (0, 0), i.e. its query and key are multiplied by zero — it is reached through its
value only. Classifier-free guidance uses the extra "null" class `num_classes` that label dropout
trains (`class_dropout_prob > 0`).

Module and parameter names match the official model exactly, so an official `c2i_*.pt` loads
with strict key matching. The official rotary table is a plain attribute, not a buffer, so it is
not in their state dict; here it is computed from positions on the fly (same float32 ops), which
also lets speculative loops feed a few draft positions past the last grid cell harmlessly.

The config and size presets are in `gpt_presets`, the blocks and the 2-D rotary embedding in
`gpt_layers`; their public names are re-exported here.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mmaccel.checkpoints import check_layout, read_configured, unwrap_state_dict, write_state_dict
from mmaccel.core.model import CachePool, DecodeState, KVCache, check_step_args, default_positions, expect, on_host, step_key
from mmaccel.errors import InputError, check
from mmaccel.image.models.gpt_layers import (  # noqa: F401  (apply_rope, Attention, FeedForward: re-exported)
    Attention,
    FeedForward,
    LabelEmbedder,
    RMSNorm,
    TransformerBlock,
    apply_rope,
    rope_2d,
)
from mmaccel.image.models.gpt_presets import (  # noqa: F401  (find_multiple, gpt_config: re-exported)
    GPT_PRESETS,
    GPTConfig,
    _check_fields,
    find_multiple,
    gpt_config,
)


class LlamaGenGPT(nn.Module):
    """LlamaGen c2i GPT in the official parameter layout, decodable by every mmaccel method.

    Inputs of `prefill` are class labels; label `num_classes` is the null class, so
    `CFG(model, scale).prefill((labels, [model.num_classes] * B), room)` is guided generation.
    Positions passed to `step` are image-token indices (0 = first image token).
    """

    cuda_graphs = False     # replay fixed-shape steps as CUDA graphs on a GPU (mmaccel.core.graphs)

    def __init__(self, config: GPTConfig = GPTConfig()):       # noqa: B008 (a frozen dataclass)
        super().__init__()
        check(isinstance(config, GPTConfig), f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.vocab_size, self.num_classes = config.vocab_size, config.num_classes
        self.cls_embedding = LabelEmbedder(config)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.tok_dropout = nn.Dropout(config.token_dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self._caches = CachePool()
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """The official init: N(0, initializer_range) for linears and embeddings, zero output head."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        nn.init.zeros_(self.output.weight)

    @property
    def device(self) -> torch.device:
        return self.output.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype     # embeddings keep their dtype in an int8 model

    # ---- inputs -------------------------------------------------------------------------------

    def _labels(self, labels: Any) -> Tensor:
        """Class labels (a sequence of ints or an int tensor [B]) as a LongTensor [B] on the model's device."""
        top = self.num_classes if self.config.has_null_class else self.num_classes - 1
        if isinstance(labels, Tensor):
            check(labels.dim() <= 1, f"labels must be a [batch] tensor, got shape {tuple(labels.shape)}")
            check(not labels.is_floating_point() and labels.dtype != torch.bool,
                  f"labels must be integer class indices, got dtype {labels.dtype}")
            labels = labels.reshape(-1).tolist()
        if not isinstance(labels, (list, tuple, str, bytes, Mapping)) and hasattr(labels, "__len__"):
            labels = list(labels)                                  # numpy arrays, ranges
        check(isinstance(labels, (list, tuple)), f"labels must be a list of class indices or a tensor, "
              f"got {type(labels).__name__}")
        check(len(labels) > 0, "labels is empty: pass at least one class index")
        out = []
        for label in labels:
            if isinstance(label, Tensor) and label.numel() == 1 and not label.is_floating_point():
                label = int(label)
            if isinstance(label, bool) or not isinstance(label, numbers.Integral):
                raise InputError(f"unknown label {label!r}: labels are class indices in [0, {self.num_classes}) "
                                 f"(and {self.num_classes} = the null class for CFG)")
            if label == self.num_classes and not self.config.has_null_class:
                raise InputError(f"label {label} is the null class, but this model was trained without label "
                                 "dropout (class_dropout_prob=0), so it has no null class and cannot do CFG")
            check(0 <= label <= top, f"label {label} out of range: class indices lie in [0, {self.num_classes})"
                  + (f", and {self.num_classes} is the null class" if self.config.has_null_class else ""))
            out.append(int(label))
        return torch.tensor(out, dtype=torch.long, device=self.device)

    # ---- decoding -----------------------------------------------------------------------------

    def _run(self, h: Tensor, rope: Tensor, mask: Tensor | None, cache: Any, depth: int | None = None) -> Tensor:
        for i, layer in enumerate(self.layers[:depth]):
            h = layer(h, rope, mask, cache, i)
        return self.norm(h)

    def early_exit(self, exit_layer: int, head: nn.Module | None = None) -> EarlyExitGPT:
        """A draft view of the first `exit_layer` layers (weights shared) for self-speculative decoding."""
        return EarlyExitGPT(self, exit_layer, head)

    def new_state(self, batch_size: int, capacity: int, depth: int | None = None, head: nn.Module | None = None) -> DecodeState:
        shape = (depth or self.config.n_layer, batch_size, self.config.kv_heads, self.config.head_dim, capacity)
        if self.cuda_graphs and not on_host(self.device):        # reused across calls, with their graphs
            return DecodeState(self._caches.take(*shape, self.dtype, self.device, tag=id(head or self.output)))
        return DecodeState(KVCache(*shape, dtype=self.dtype, device=self.device))

    def prefill(self, inputs: Any, room: int) -> DecodeState:
        """Run the class token of each label [B]; `state.logits` [B, V] give image token 0.

        The cache has room for the class token and `room` image tokens (the loop asks for its draft
        slack on top of the image length).
        """
        return self._prefill(inputs, room, self.config.n_layer, self.output)

    def admit(self, state: DecodeState, row: int, label: int) -> DecodeState:
        """Row `row` of `state` (whose image has ended) starts over on class `label`; the other rows stay as they
        are. Returns the label's own one-row state (the logits of its image token 0): a request that joins a call
        in progress (continuous batching)."""
        return _admit(self.prefill, state, row, label)

    def step(self, state: DecodeState, tokens: Tensor, positions: Tensor | None = None,
             tree_mask: Tensor | None = None, embeds: Tensor | None = None) -> Tensor:
        """Append image tokens [B, T]; returns logits [B, T, V] (row t predicts the token after tokens[:, t]).

        `positions` [B, T] are image-token indices (default: the next free ones, or prefix + depth for
        a tree); index i is rotated as grid cell (i // grid, i % grid). `embeds` [B, T, dim], when given,
        are fed instead of the tokens' embeddings (SJD2's noisy window; `tokens` then only fix the shape).
        """
        return self._step(state, tokens, positions, tree_mask, self.config.n_layer, self.output, embeds)

    @torch.inference_mode()
    def _prefill(self, inputs: Any, room: int, depth: int, head: nn.Module) -> DecodeState:
        labels = self._labels(inputs)
        check(isinstance(room, int) and not isinstance(room, bool) and room >= 0, f"room must be an int >= 0, got {room!r}")
        state = self.new_state(labels.shape[0], self.config.cls_token_num + room, depth, head)
        write, start = state.cache.reserve(self.config.cls_token_num)
        mask = state.cache.attention_mask(start, self.config.cls_token_num, None)
        h = self.cls_embedding(labels)                                         # [B, 1, dim]
        rope = h.new_zeros(*h.shape[:2], self.config.head_dim // 2, 2, dtype=torch.float32)
        h = self._run(h, rope, mask, write, depth)
        state.hidden = h
        state.logits = head(h[:, -1]).float()
        return state

    @torch.inference_mode()
    def _step(self, state: DecodeState, tokens: Tensor, positions: Tensor | None, tree_mask: Tensor | None,
              depth: int, head: nn.Module, embeds: Tensor | None = None) -> Tensor:
        check_step_args(state, tokens, tree_mask, self.vocab_size)
        self._check_embeds(tokens, embeds)
        if positions is not None:
            check(isinstance(positions, Tensor) and positions.shape == tokens.shape,
                  f"positions must be a tensor shaped like tokens {tuple(tokens.shape)}")
            expect(positions >= 0, "positions are image-token indices and must be >= 0")
            positions = positions.to(self.device)
        cache = state.cache

        def body(x: Tensor, positions: Tensor | None, tree_mask: Tensor | None) -> tuple[Tensor, Tensor]:
            T = x.shape[1]
            write, start = cache.reserve(T)
            mask = cache.attention_mask(start, T, tree_mask)
            if positions is None:
                positions = default_positions(start, T, tree_mask) - self.config.cls_token_num
            h = self._run(x, rope_2d(positions, self.config), mask, write, depth)
            return head(h).float(), h

        x = self.tok_embeddings(tokens.to(self.device)) if embeds is None else embeds.to(self.device, self.dtype)
        inputs = (x, positions, None if tree_mask is None else tree_mask.to(self.device))
        if self.cuda_graphs and cache.graphs_apply:
            logits, state.hidden = cache.graphs.run(step_key(inputs, depth, head), body, *inputs)
        else:
            logits, state.hidden = body(*inputs)
        return logits

    def _check_embeds(self, tokens: Tensor, embeds: Tensor | None) -> None:
        if embeds is not None:
            shape = (*tokens.shape, self.config.dim)
            check(isinstance(embeds, Tensor) and tuple(embeds.shape) == shape and embeds.is_floating_point(),
                  f"embeds must be a float tensor of shape {shape} (tokens' shape + model dim), got "
                  f"{tuple(embeds.shape) if isinstance(embeds, Tensor) else type(embeds).__name__}")

    # ---- training -----------------------------------------------------------------------------

    def forward(self, labels: Any, tokens: Tensor, embeds: Tensor | None = None) -> Tensor:
        """Teacher-forced logits [B, N + 1, V] for class token + image tokens [B, N] (N <= block_size).

        Row j predicts image token j, so training on targets `x` [B, L] feeds `tokens = x[:, :-1]`
        (the official c2i trainer). In training mode label dropout and the dropouts are active.
        `embeds` [B, N, dim], when given, replace the tokens' embeddings as inputs (SJD2's fine-tune).
        """
        labels = self._labels(labels)
        check(isinstance(tokens, Tensor) and tokens.dim() == 2, f"tokens must be a [batch, N] tensor, "
              f"got {tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
        check(not tokens.is_floating_point() and tokens.dtype != torch.bool, f"tokens must be integer ids, got {tokens.dtype}")
        check(tokens.shape[0] == labels.shape[0], f"{labels.shape[0]} labels but {tokens.shape[0]} token rows")
        N = tokens.shape[1]
        check(N <= self.config.block_size, f"sequence of {N} image tokens is longer than block_size "
              f"{self.config.block_size} ({self.config.grid_size}x{self.config.grid_size} grid)")
        check(bool(((tokens >= 0) & (tokens < self.vocab_size)).all()), f"token ids must lie in [0, {self.vocab_size})")
        self._check_embeds(tokens, embeds)
        x = self.tok_embeddings(tokens.to(self.device)) if embeds is None else embeds.to(self.device, self.dtype)
        h = torch.cat([self.cls_embedding(labels), x], dim=1)
        h = self.tok_dropout(h)
        B = h.shape[0]
        cls_rope = torch.zeros(B, self.config.cls_token_num, self.config.head_dim // 2, 2, device=self.device)
        img_rope = rope_2d(torch.arange(N, device=self.device).expand(B, N), self.config)
        h = self._run(h, torch.cat([cls_rope, img_rope], dim=1), None, None)
        return self.output(h[:, self.config.cls_token_num - 1:]).float()


class EarlyExitGPT:
    """The first `exit_layer` layers of a LlamaGenGPT, then its final norm and `head` (default: its
    own output layer) — a weight-sharing draft for self-speculation (LayerSkip-style)."""

    def __init__(self, model: LlamaGenGPT, exit_layer: int, head: nn.Module | None = None):
        n = model.config.n_layer
        check(isinstance(exit_layer, int) and 1 <= exit_layer <= n, f"exit layer must be in [1, {n}], got {exit_layer}")
        self.model, self.exit_layer = model, exit_layer
        self.head = model.output if head is None else head
        self.vocab_size, self.num_classes = model.vocab_size, model.num_classes

    @property
    def device(self) -> torch.device:
        return self.model.device

    def prefill(self, inputs: Any, room: int) -> DecodeState:
        return self.model._prefill(inputs, room, self.exit_layer, self.head)

    def admit(self, state: DecodeState, row: int, label: int) -> DecodeState:
        return _admit(self.prefill, state, row, label)

    def step(self, state: DecodeState, tokens: Tensor, positions: Tensor | None = None,
             tree_mask: Tensor | None = None) -> Tensor:
        return self.model._step(state, tokens, positions, tree_mask, self.exit_layer, self.head)


def _admit(prefill, state: DecodeState, row: int, label: int) -> DecodeState:
    """`prefill` of `label` alone, copied into row `row` of `state`'s cache; that one-row state."""
    alone = prefill([label], 0)
    state.cache.take_row(row, alone.cache)
    return alone


# ---- checkpoints --------------------------------------------------------------------------------

# Derived tensors that a saved official model may carry (`setup_caches` registers KV-cache buffers;
# LlamaGen's sampler anticipates a stray `freqs_cis`); they hold no weights, so loading drops them.
_DERIVED_KEYS = ("freqs_cis", "causal_mask")
_DERIVED_SUFFIXES = (".kv_cache.k_cache", ".kv_cache.v_cache")


def unwrap_gpt_state_dict(ckpt: Mapping, source: str = "checkpoint") -> dict[str, Tensor]:
    """The weights inside an official container (see `mmaccel.checkpoints.unwrap_state_dict`), with
    derived buffers (`freqs_cis`, causal mask, KV caches) dropped: they hold no weights."""
    return unwrap_state_dict(ckpt, source, drop=_DERIVED_KEYS + _DERIVED_SUFFIXES)


def infer_config(state: Mapping[str, Tensor], **overrides: Any) -> GPTConfig:
    """A GPTConfig whose shapes match `state`; n_head comes from the preset with the same depth and width
    (or `overrides`), block_size defaults to 256 (pass block_size=576 for 384px checkpoints)."""
    needed = ["tok_embeddings.weight", "cls_embedding.embedding_table.weight", "layers.0.attention.wqkv.weight",
              "layers.0.feed_forward.w1.weight"]
    missing = [k for k in needed if k not in state]
    check(not missing, f"not a LlamaGen c2i GPT state dict: missing {', '.join(missing)}")
    vocab, dim = state["tok_embeddings.weight"].shape
    n_layer = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("layers."))
    values: dict[str, Any] = {"dim": dim, "vocab_size": vocab, "n_layer": n_layer}
    if "n_head" not in overrides:
        heads = [h for (layers, h, d) in GPT_PRESETS.values() if (layers, d) == (n_layer, dim)]
        check(bool(heads), f"cannot infer n_head for a {n_layer}-layer, dim-{dim} model (no preset matches); "
              "pass config=GPTConfig(...) or n_head=...")
        values["n_head"] = heads[0]
    values.update(overrides)
    head_dim = values["dim"] // values["n_head"]
    rows = state["layers.0.attention.wqkv.weight"].shape[0] // head_dim
    if rows != 3 * values["n_head"] and "n_kv_head" not in overrides:
        values["n_kv_head"] = (rows - values["n_head"]) // 2
    if "num_classes" not in overrides:
        table = state["cls_embedding.embedding_table.weight"].shape[0]
        null = values.get("class_dropout_prob", GPTConfig.class_dropout_prob) > 0
        values["num_classes"] = table - int(null)
    if "multiple_of" not in overrides and "ffn_dim_multiplier" not in overrides:
        hidden = state["layers.0.feed_forward.w1.weight"].shape[0]
        for multiple in (256, 128, 64, 32, 16, 8, 4, 2, 1):
            if replace(GPTConfig(), dim=values["dim"], n_head=values["n_head"], multiple_of=multiple,
                       n_kv_head=None).ffn_hidden_dim == hidden:
                values["multiple_of"] = multiple
                break
    return GPTConfig(**values)


def load_gpt(source: Any, config: GPTConfig | None = None, *, dtype: torch.dtype | None = None,
             **overrides: Any) -> LlamaGenGPT:
    """Load a LlamaGen c2i GPT from an official checkpoint path (.pt/.pth, any official container, or
    .safetensors) or an in-memory checkpoint/state dict. Keys and shapes must match exactly.

    Without `config` the size is read off the weights (see `infer_config`); `overrides` adjust it.
    Raises ModelNotFoundError for a missing file and InputError for unreadable or mismatching ones.
    """
    _check_fields(overrides)
    check(isinstance(source, (str, os.PathLike, Mapping)), f"load_gpt takes a checkpoint path or a state dict, "
          f"got {type(source).__name__}")
    state, stored, name = read_configured(source, _CONFIG_KEY, "LlamaGen GPT checkpoint (a c2i_*.pt or .safetensors "
                                          "file)", drop=_DERIVED_KEYS + _DERIVED_SUFFIXES)
    # a trainer's own "config" next to the weights (run settings such as train_sjd2's) is not a GPTConfig
    if config is None and stored is not None and set(stored) <= {f.name for f in fields(GPTConfig)}:
        config = GPTConfig(**stored)
    if config is None:
        config = infer_config(state, **overrides)
    elif overrides:
        config = replace(config, **overrides)
    with torch.device("meta"):
        model = LlamaGenGPT(config)
    check_layout(model.state_dict(), state, name, f"LlamaGen GPT (dim={config.dim}, n_layer={config.n_layer}, "
                 f"n_head={config.n_head}, vocab_size={config.vocab_size}, num_classes={config.num_classes})")
    model.load_state_dict(state, strict=True, assign=True)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


_CONFIG_KEY = "mmaccel_gpt_config"


def save_gpt(model: LlamaGenGPT, path: str | os.PathLike, metadata: Mapping[str, str] | None = None,
             dtype: torch.dtype | None = None) -> Path:
    """Write `model` so `load_gpt(path)` restores it exactly (in `dtype`, e.g. fp16 for shipping, when
    given): `.safetensors` with the config (and any `metadata` strings) in the header, or `.pt` as the
    official container with the config next to the weights, `{"model": state_dict, "config": {...}}`."""
    return write_state_dict(model, path, _CONFIG_KEY, asdict(model.config), dtype, metadata=metadata)
