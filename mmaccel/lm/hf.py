"""Hugging Face decoder-only LMs (Llama, SmolLM, Qwen2, Mistral layouts) as mmaccel DecoderModels.

The adapter runs the model's own modules (embedding, decoder layers, rotary embedding, norm, head)
but hands every attention layer our preallocated cache as its `past_key_values` and an explicit
boolean mask, which is what ragged per-row acceptance and tree attention need and what HF's own
caches do not offer (their batch rows share one length).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmaccel.core.model import (
    CachePool,
    DecodeState,
    KVCache,
    append_ragged,
    check_step_args,
    default_positions,
    on_host,
    step_key,
)
from mmaccel.errors import InputError, check


class HFCausalLM(nn.Module):
    """DecoderModel over `model` (e.g. `LlamaForCausalLM`), using its first `num_layers` layers.

    `head` replaces the LM head (an early-exit head); by default the model's own head is used.
    """

    cuda_graphs = False     # replay fixed-shape steps as CUDA graphs on a GPU (mmaccel.core.graphs)

    def __init__(self, model: nn.Module, num_layers: int | None = None, head: nn.Module | None = None):
        super().__init__()
        inner = getattr(model, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, a) for a in needed) or not hasattr(model, "lm_head"):
            raise InputError(f"{type(model).__name__} is not a supported decoder-only LM: "
                             f"expected .model.{{{', '.join(needed)}}} "
                             "and .lm_head (Llama/Qwen2/Mistral-style causal LMs)")
        self.hf = model
        total = len(inner.layers)
        self.num_layers = total if num_layers is None else num_layers
        check(1 <= self.num_layers <= total, f"exit layer must be in [1, {total}], got {num_layers}")
        self.head = head if head is not None else model.lm_head
        self._caches = CachePool()
        cfg = model.config
        self.vocab_size = cfg.vocab_size
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.hf.eval()

    @property
    def device(self) -> torch.device:
        return self.hf.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.hf.model.embed_tokens.weight.dtype     # embeddings keep their dtype in an int8 model

    def early_exit(self, exit_layer: int, head: nn.Module | None = None) -> HFCausalLM:
        """A view of the first `exit_layer` layers (weights shared) for self-speculative drafting."""
        view = HFCausalLM(self.hf, exit_layer, head)
        view.cuda_graphs = self.cuda_graphs
        return view

    def new_state(self, batch_size: int, capacity: int) -> DecodeState:
        shape = (self.num_layers, batch_size, self.num_kv_heads, self.head_dim, capacity)
        if self.cuda_graphs and not on_host(self.device):        # reused across calls, with their graphs
            return DecodeState(self._caches.take(*shape, self.dtype, self.device))
        return DecodeState(KVCache(*shape, dtype=self.dtype, device=self.device))

    def prefill(self, inputs: list[list[int]] | list[Tensor], room: int) -> DecodeState:
        """Run a batch of token-id prompts (ragged lengths allowed), leaving cache room for `room` more tokens."""
        check(isinstance(inputs, (list, tuple)) and len(inputs) > 0, "prompts must be a non-empty list of token-id sequences")
        rows = [torch.as_tensor(r, dtype=torch.long).reshape(-1) for r in inputs]
        check(all(len(r) > 0 for r in rows), "every prompt needs at least one token")
        check(isinstance(room, int) and room >= 0, f"room must be an int >= 0, got {room}")
        state = self.new_state(len(rows), max(len(r) for r in rows) + room)
        state.logits = append_ragged(self, state, rows)
        return state

    def admit(self, state: DecodeState, row: int, prompt: list[int]) -> DecodeState:
        """Run `prompt` into row `row` of `state` (a row whose decoding has ended; the others stay as they are).
        Returns the prompt's own one-row state (the logits of its first new token, its hidden states): how a
        request joins a call in progress (continuous batching)."""
        alone = self.prefill([prompt], 0)
        state.cache.take_row(row, alone.cache)
        return alone

    @torch.inference_mode()
    def step(self, state: DecodeState, tokens: Tensor, positions: Tensor | None = None,
             tree_mask: Tensor | None = None) -> Tensor:
        check_step_args(state, tokens, tree_mask, self.vocab_size)
        tokens, positions, tree_mask = (None if x is None else x.to(self.device) for x in (tokens, positions, tree_mask))
        return run_layers(state, self.hf.model, self.head, tokens, positions, tree_mask, num_layers=self.num_layers,
                          cuda_graphs=self.cuda_graphs)


def run_layers(state: DecodeState, decoder: nn.Module, head: nn.Module, x: Tensor, positions: Tensor | None = None,
               tree_mask: Tensor | None = None, *, num_layers: int | None = None, cuda_graphs: bool = False) -> Tensor:
    """Append `x` (token ids [B, T], or input embeddings [B, T, d] that a VLM spliced vision into) to
    `state.cache` through a Hugging Face decoder's own modules (`decoder.embed_tokens, layers, rotary_emb,
    norm`; its first `num_layers` layers) and `head`. Returns float logits [B, T, V] and sets `state.hidden`.

    `positions` are the rotary ids: [B, T], or M-RoPE's [3, B, T]; None places the tokens after each row's
    cache length (a tree: prefix + depth). Every layer gets our cache as `past_key_values` and an explicit
    boolean mask, which ragged rows and trees need. With `cuda_graphs`, fixed-shape appends on a GPU replay
    as captured graphs (`mmaccel.core.graphs`), so everything that varies is an input of `body`.
    """
    cache = state.cache
    layers = decoder.layers[:num_layers]
    eager = getattr(decoder.config, "_attn_implementation", None) == "eager"

    def body(x: Tensor, positions: Tensor | None, tree_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        T = x.shape[1]
        write, start = cache.reserve(T)
        mask = cache.attention_mask(start, T, tree_mask)
        if positions is None:
            positions = default_positions(start, T, tree_mask)
        h = decoder.embed_tokens(x) if x.dim() == 2 else x
        if eager:   # HF's eager attention adds the mask to the scores: give it the additive form
            mask = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill(~mask, torch.finfo(h.dtype).min)
        rope = decoder.rotary_emb(h, position_ids=positions)
        ids = positions if positions.dim() == 2 else None       # layers take 1-D ids only; M-RoPE is in `rope`
        for layer in layers:
            h = layer(h, attention_mask=mask, position_ids=ids, past_key_values=write, position_embeddings=rope)
            if isinstance(h, tuple):  # older layer signatures return (hidden, ...)
                h = h[0]
        h = decoder.norm(h)
        return head(h).float(), h

    inputs = (x, positions, tree_mask)
    if cuda_graphs and cache.graphs_apply:
        logits, state.hidden = cache.graphs.run(step_key(inputs, len(layers), head), body, *inputs)
    else:
        logits, state.hidden = body(*inputs)
    return logits
