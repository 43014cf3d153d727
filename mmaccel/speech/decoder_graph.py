"""The int8 Whisper decoder's pass as one compiled graph that keeps its own key/value cache (`DecoderGraph`).

What an int8 target runs on a CPU with OpenVINO (`ASRPipeline(precision="int8" | "auto")`): the whole pass, the
vocabulary projection included, is one graph (`DecoderStep`; its linear layers multiply in int8, the weights with a
scale per row and the activations quantised per token as it runs, as CTranslate2 does; the rest in f32), each layer's
self-attention keys/values are bf16 OpenVINO state (`mmaccel.engine.stateful`) and the cross-attention keys/values
are bf16 inputs set once per window. The timestamp rules and the suppression stay in
torch on its logits. Measured in `benchmarks/engine/decoder_step_stateful.md`.

- One graph shape for every pass: `WIDTH` queries (a one-token pass is the pending token and padding; a verify pass
  of more tokens runs as consecutive chunks of `WIDTH`, each seeing the ones before through the cache). A token's
  logits are then computed by the same kernels at the same shapes whichever pass it is in, which is what keeps
  greedy-verified methods greedy-identical on this engine (tested, `tests/speech/test_decoder_graph.py`).
- The cache is `GraphCache`: the `KVCache` bookkeeping (lengths, masks, token ids, ragged rows, O(1) rollback)
  with the entries inside the runtime, at the slots the bookkeeping gives. Padding queries write one scratch slot
  past Whisper's 448 positions that no query sees. A joining row and tree compaction write their entries into the
  state in place (`Session.state_views`); row selection (beam search) copies it.
- A batch size the graph cannot be compiled for falls back to the eager int8 pass with one warning line.
"""

from __future__ import annotations

import warnings
import weakref

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.core.kv_cache import KVCache
from mmaccel.engine.compiled import first_line
from mmaccel.engine.stateful import StatefulGraph, compile_stateful, to_ov
from mmaccel.errors import check

WIDTH = 8           # queries per graph call: the pending token and up to seven drafts


class DecoderStep(nn.Module):
    """One decoder pass as the graph holds it: h [B, W, d] (embedded tokens and positions), visible [B, 1, W, S]
    (1: may attend), slots [B, W] (where the new keys go), then per layer the self-attention keys, then values
    ([B, H, S, Dh] each, in the dtype the graph keeps them: bf16), the cross-attention keys, then values
    ([B, H, F, Dh], bf16) -> (logits [B, W, V], every
    layer's output then the final hidden states [B, W, (L + 1) d], each layer's keys, each layer's values with the
    new entries written)."""

    def __init__(self, decoder: nn.Module, num_heads: int):
        super().__init__()
        self.layers, self.norm, self.num_heads = decoder.layers, decoder.layer_norm, num_heads
        vocab, d = decoder.embed_tokens.weight.shape
        self.project = nn.Linear(d, vocab, bias=False)
        self.project.weight = decoder.embed_tokens.weight

    def forward(self, h: Tensor, visible: Tensor, slots: Tensor, *caches: Tensor) -> tuple[Tensor, ...]:
        B, T, d = h.shape
        H, L = self.num_heads, len(self.layers)
        self_k, self_v, cross_k, cross_v = (caches[j * L : (j + 1) * L] for j in range(4))
        mask = torch.zeros_like(visible).masked_fill(visible < 0.5, float("-inf"))
        at = slots[:, None, :, None].expand(B, H, T, d // H)

        def heads(t: Tensor) -> Tensor:
            return t.view(B, T, H, d // H).transpose(1, 2)

        def merge(t: Tensor) -> Tensor:
            return t.transpose(1, 2).reshape(B, T, d)

        keys, values, outputs = [], [], []
        for i, layer in enumerate(self.layers):
            a, c = layer.self_attn, layer.encoder_attn
            x = layer.self_attn_layer_norm(h)
            k = self_k[i].scatter(2, at, heads(a.k_proj(x)).to(self_k[i].dtype))
            v = self_v[i].scatter(2, at, heads(a.v_proj(x)).to(self_v[i].dtype))
            keys.append(k)
            values.append(v)
            attended = F.scaled_dot_product_attention(heads(a.q_proj(x)).to(k.dtype), k, v, attn_mask=mask.to(k.dtype))
            h = h + a.out_proj(merge(attended.to(h.dtype)))
            q = heads(c.q_proj(layer.encoder_attn_layer_norm(h))).to(cross_k[i].dtype)
            h = h + c.out_proj(merge(F.scaled_dot_product_attention(q, cross_k[i], cross_v[i]).to(h.dtype)))
            h = h + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(h))))
            outputs.append(h)
        h = self.norm(h)
        return (self.project(h), torch.cat([*outputs, h], -1), *keys, *values)


class GraphCache(KVCache):
    """`KVCache` bookkeeping over entries held by a compiled graph's `Session` (see the module docstring)."""

    def __init__(self, graph: DecoderGraph, session, batch_size: int, capacity: int):
        super().__init__(0, batch_size, graph.num_heads, graph.head_dim, capacity, full_width=True)
        self.graph, self.session = graph, session
        self._release = weakref.finalize(self, session.release)
        self.cross: list | None = None       # the cross-attention inputs set on the session (ov tensors)
        self.cross_for = None                # the EncodedAudio they hold, and the rows it had taken then
        self.cross_sources: dict = {}

    def _swap(self, session) -> None:
        self._release.detach()
        self.session.release()
        self.session, self._release = session, weakref.finalize(self, session.release)
        self.cross = None

    @torch.inference_mode()
    def select_rows(self, index: Tensor) -> None:
        entries = [a[index.cpu()] for a in self.session.read_state()]
        super().select_rows(index)
        if entries[0].shape[0] != self.session.batch:
            self._swap(self.graph.stateful.session(entries[0].shape[0]))
        self.session.write_state(entries)
        self.cross = None                       # the rows' audio is rebuilt at the next pass

    @torch.inference_mode()
    def take_row(self, row: int, other: KVCache) -> None:
        check(other.batch_size == 1, "take_row takes a one-row cache")
        n = int(other.lengths[0])
        check(n <= self.capacity, f"a joining row of {n} entries does not fit the cache's capacity {self.capacity}")
        theirs = other.session.read_state() if isinstance(other, GraphCache) else [*other.k, *other.v]
        views = self.session.state_views()
        mine = views if views is not None else self.session.read_state()
        for a, b in zip(mine, theirs, strict=True):
            a[row, :, :n] = b[0, :, :n]
        if views is None:
            self.session.write_state(mine)
        if self.ids is not None:
            self.ids[row, :n] = 0 if other.ids is None else other.ids[0, :n]
        self.lengths[row] = n

    def _move(self, src: Tensor, dst: Tensor) -> None:
        views = self.session.state_views()
        entries = views if views is not None else self.session.read_state()
        self._move_in(entries, src, dst)
        if views is None:
            self.session.write_state(entries)


class DecoderGraph:
    """The compiled pass of an int8 `WhisperDecoderModel` (see the module docstring); `new_cache(batch)` -> a
    `GraphCache` (None: this batch size runs eagerly), `run(model, state, ...)` -> the pass's logits and hidden
    states."""

    def __init__(self, stateful: StatefulGraph, num_layers: int, num_heads: int, head_dim: int, slots: int):
        self.stateful, self.num_layers, self.num_heads, self.head_dim = stateful, num_layers, num_heads, head_dim
        self.slots = slots                  # cache slots in the graph: Whisper's positions and one scratch slot
        self._failed: set[int] = set()

    @classmethod
    def of(cls, model, cache_dir=None) -> DecoderGraph | None:
        """The graph of `model` (an int8 target's full decoder), or None with one warning line."""
        check(model.quantized and model.num_layers == len(model.decoder.layers) and model.exit_head is None,
              "a decoder graph is built for an int8 target's full decoder")
        L, H, Dh = model.num_layers, model.num_heads, model.head_dim
        S, frames = model.max_positions + 1, model.hf.config.max_source_positions
        g = torch.Generator().manual_seed(0)
        h = torch.randn(1, WIDTH, H * Dh, generator=g)
        visible = torch.ones(1, 1, WIDTH, S)
        visible[..., 16:] = 0.0
        slots = torch.arange(16 - WIDTH, 16)[None]
        caches = [torch.randn(1, H, S, Dh, generator=g).to(torch.bfloat16) for _ in range(2 * L)]
        cross = [torch.randn(1, H, frames, Dh, generator=g).to(torch.bfloat16) for _ in range(2 * L)]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(trace|Tracer|tracing).*")
            stateful = compile_stateful(DecoderStep(model.decoder, H).eval(), (h, visible, slots, *caches, *cross),
                                        list(range(3, 3 + 2 * L)), "int8", cache_dir, int8_activations=True)
        return None if stateful is None else cls(stateful, L, H, Dh, S)

    def new_cache(self, batch_size: int, capacity: int) -> GraphCache | None:
        if batch_size in self._failed:
            return None
        try:
            session = self.stateful.session(batch_size)
        except Exception as e:  # noqa: BLE001 - a batch size that does not compile runs eagerly
            self._failed.add(batch_size)
            warnings.warn(f"mmaccel: the int8 decoder runs eagerly at batch {batch_size}: its graph does not compile "
                          f"({first_line(e)})", stacklevel=3)
            return None
        return GraphCache(self, session, batch_size, capacity)

    @torch.inference_mode()
    def run(self, model, state, tokens: Tensor, positions: Tensor | None,
            tree_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Append `tokens` [B, T] to `state` (a `GraphCache` state) -> (logits [B, T, V], hidden [B, T, (L + 1) d])."""
        cache: GraphCache = state.cache
        B, T = tokens.shape
        write, start = cache.reserve(T)
        write.record(tokens)
        mask = cache.attention_mask(start, T, tree_mask)                  # [B, 1, T, capacity] (True: attend)
        h = model.embedded(state, tokens, positions, start, tree_mask)
        self._set_cross(model, state)
        S, d = self.slots, h.shape[-1]
        logits = torch.empty(B, T, model.vocab_size)
        hidden = torch.empty(B, T, (self.num_layers + 1) * d)
        for c in range(0, T, WIDTH):
            n = min(WIDTH, T - c)
            chunk = torch.zeros(B, WIDTH, d)
            chunk[:, :n] = h[:, c : c + n]
            visible = torch.zeros(B, 1, WIDTH, S)
            visible[:, :, :n, : cache.capacity] = mask[:, :, c : c + n]
            visible[:, :, n:, S - 1] = 1.0                # padding sees only the scratch slot it writes
            slots = torch.full((B, WIDTH), S - 1, dtype=torch.long)
            slots[:, :n] = write.slots[:, c : c + n]
            out = cache.session.run({0: chunk.numpy(), 1: visible.numpy(), 2: slots.numpy()})
            logits[:, c : c + n] = torch.from_numpy(out[0][:, :n])
            hidden[:, c : c + n] = torch.from_numpy(out[1][:, :n])
        return logits, hidden

    def _set_cross(self, model, state) -> None:
        """The session's cross-attention inputs: every row's when the audio is new to it, else the rows that took
        another window since (`EncodedAudio.take_row`)."""
        cache: GraphCache = state.cache
        inputs = state.extras["inputs"]
        L = self.num_layers
        if cache.cross is None or cache.cross_for is not inputs:
            import openvino as ov

            cache.cross = []
            for j in range(2):
                for i in range(L):
                    t = model._cross(inputs, i)[j]
                    if inputs.group > 1:
                        t = t.repeat_interleave(inputs.group, 0)
                    cache.cross.append(to_ov(ov, t.to(torch.bfloat16)))
            for index, tensor in enumerate(cache.cross, start=3 + 2 * L):
                cache.session.set_input(index, tensor)
        else:
            for row, source in inputs.sources.items():
                if cache.cross_sources.get(row) is source:
                    continue
                for j in range(2):
                    for i in range(L):
                        bits = model._cross(inputs, i)[j][row].to(torch.bfloat16).contiguous().view(torch.int16)
                        np.copyto(cache.cross[j * L + i].data.view(np.uint16)[row], bits.numpy().view(np.uint16))
        cache.cross_for, cache.cross_sources = inputs, dict(inputs.sources)
