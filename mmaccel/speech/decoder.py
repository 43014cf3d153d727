"""The Whisper decoder as an mmaccel `DecoderModel`, so every core method decodes speech.

The forward pass is written out here over the weights of a Hugging Face
`WhisperForConditionalGeneration` (pre-LN self-attention, cross-attention to the encoder, GELU MLP,
final LayerNorm, vocabulary projection tied to the token embedding). Owning those few lines rather
than calling HF's layers gives our preallocated per-row KV cache (O(1) rollback, ragged rows), tree
masks, early-exit views and the hidden states Medusa heads read, and keeps us clear of HF's
changing cache internals. Cross-attention keys/values are computed once per utterance.

Whisper's decoding rules are part of the model here: `suppress_tokens` are masked at every step,
`begin_suppress_tokens` at the first generated position and, in timestamp mode, the timestamp rules
(`timestamps`) everywhere, exactly as `generate()` applies them: every method decodes under the same
rules and greedy equals HF greedy.

Its parts are in `decoder_audio`, `decoder_layers` and `decoder_readout` (their names re-exported here).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.core.model import DecodeState, KVCache, check_step_args, default_positions, expect, step_key
from mmaccel.core.readout import project
from mmaccel.engine.attention import fixed_shape_attention
from mmaccel.engine.compiled import Compiled
from mmaccel.engine.int8 import Int8Linear
from mmaccel.errors import check
from mmaccel.speech.decoder_audio import EncodedAudio, audio_frames
from mmaccel.speech.decoder_graph import DecoderGraph, GraphCache
from mmaccel.speech.decoder_layers import LayerOps, LayerStep, _norm, kept_positions
from mmaccel.speech.decoder_readout import ArgmaxProjection, ExitHead, ShortlistProjection  # noqa: F401  (ExitHead: re-exported)
from mmaccel.speech.timestamps import TimestampRules, rule_logits


class EncoderStates(nn.Module):
    """A Hugging Face Whisper encoder as a function of tensors: log-mel [B, mels, frames] -> states [B, S, D] (the
    form `mmaccel.engine.compiled` exports)."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, features: Tensor) -> Tensor:
        return self.encoder(features).last_hidden_state


class WhisperDecoderModel:
    """DecoderModel over the decoder of `hf` (a `WhisperForConditionalGeneration`).

    `suppress_tokens` / `begin_suppress_tokens` are token ids (the model's generation config by
    default). A view with `num_layers` < all layers and an `exit_head` is an early-exit draft.
    `cross_layers[i]` names the cross-attention cache entry layer i reads and fills (default i): a
    draft decoder whose cross-attention key/value projections are frozen copies of target layers
    shares the target's entries. `projection` reads logits out through a vocabulary shortlist.
    `argmax_readout` (see `argmax_view`) makes `step` return logits exact only at each row's arg-max.
    `cross_window` (frames, for drafts) limits cross-attention to each row's audio frames plus that
    many after them, where the audio's length is known (`encode(..., seconds=)`): short clips are
    mostly padding of Whisper's 30-s window, which the full model must attend to and a draft need not.
    `quantized` runs the layers on int8 copies of their weights (`LayerOps`) and, without a shortlist or exit head,
    the vocabulary projection too (`Int8Linear`: a scale per weight row and per token, each row's product the same
    in a pass of one token or many): an int8 target (`ASRPipeline(precision="int8")`) or a draft.
    `fixed_shape` (an int8 target): attention in one kernel shape (`mmaccel.engine.attention`) over a cache of the
    full `max_positions`; with int8's exact products a token's logits are then bitwise the same in a one-token pass,
    a verify pass of any width and a ragged batch, so greedy-verified methods are greedy-identical by construction.
    """

    skips_filler = True     # `step` takes `valid` (the DecoderModel protocol's optional filler skipping)
    cuda_graphs = False     # replay fixed-shape steps as CUDA graphs on a GPU (mmaccel.core.graphs)

    def __init__(self, hf, suppress_tokens: list[int] | None = None, begin_suppress_tokens: list[int] | None = None,
                 num_layers: int | None = None, exit_head: nn.Module | None = None,
                 cross_layers: list[int] | None = None, projection: ShortlistProjection | None = None,
                 argmax_readout: ArgmaxProjection | None = None, cross_window: int | None = None,
                 quantized: bool = False, fixed_shape: bool = False):
        decoder = getattr(getattr(hf, "model", None), "decoder", None)
        check(decoder is not None and hasattr(decoder, "layers") and hasattr(decoder, "embed_positions"),
              f"{type(hf).__name__} is not a Whisper encoder-decoder (expected .model.decoder with layers)")
        self.hf, self.decoder = hf.eval(), decoder
        cfg = hf.config
        gen = getattr(hf, "generation_config", None)
        total = len(decoder.layers)
        self.num_layers = total if num_layers is None else num_layers
        check(isinstance(self.num_layers, int) and 1 <= self.num_layers <= total,
              f"exit layer must be an integer in [1, {total}], got {num_layers!r}")
        self.exit_head = exit_head
        self.cross_layers = list(range(total)) if cross_layers is None else list(cross_layers)
        check(len(self.cross_layers) == total, f"cross_layers needs one entry per decoder layer ({total}), "
              f"got {len(self.cross_layers)}")
        self.projection = projection if projection is not None else getattr(exit_head, "projection", None)
        self.argmax_readout = argmax_readout
        check(cross_window is None or (isinstance(cross_window, int) and cross_window >= 0),
              f"cross_window must be None or an int >= 0 (frames), got {cross_window!r}")
        self.cross_window = cross_window
        self._ops = [LayerOps(layer, quantized) for layer in decoder.layers[: self.num_layers]]
        self.quantized = quantized
        self.fixed_shape = fixed_shape
        self._attend = fixed_shape_attention if fixed_shape else F.scaled_dot_product_attention
        plain = self.projection is None and exit_head is None and argmax_readout is None
        self._int8_projection = Int8Linear.of(decoder.embed_tokens.weight) if quantized and plain else None
        self.feature_layers: tuple[int, ...] = ()     # see `feature_view`
        self._graph: dict = {"wanted": False, "graph": None}   # the compiled pass (`compile_graph`), shared by views
        self.reads_timestamps_as_none = False          # see `as_read` (drafts trained without timestamps)
        self.vocab_size = cfg.vocab_size
        self.num_heads = cfg.decoder_attention_heads
        self.head_dim = cfg.d_model // self.num_heads
        self.max_positions = cfg.max_target_positions
        self.embed_scale = cfg.d_model ** 0.5 if getattr(cfg, "scale_embedding", False) else 1.0
        if suppress_tokens is None:
            suppress_tokens = list(getattr(gen, "suppress_tokens", None) or [])
        if begin_suppress_tokens is None:
            begin_suppress_tokens = list(getattr(gen, "begin_suppress_tokens", None) or [])
        self.suppress_tokens, self.begin_suppress_tokens = list(suppress_tokens), list(begin_suppress_tokens)
        self._bias = self._suppression(self.suppress_tokens)
        self._begin_bias = self._bias + self._suppression(self.begin_suppress_tokens)
        self._shortlist_bias = None if self.projection is None else self._bias[self.projection.vocab]

    def _suppression(self, ids: list[int]) -> Tensor:
        bias = torch.zeros(self.vocab_size, device=self.device)
        ids = [i for i in ids if 0 <= i < self.vocab_size]
        bias[ids] = float("-inf")
        return bias

    @property
    def device(self) -> torch.device:
        return self.decoder.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.embed_tokens.weight.dtype

    @property
    def suppression(self) -> Tensor:
        """[V] additive bias (-inf on `suppress_tokens`) that `step` adds to every logit row."""
        return self._bias

    @property
    def hidden_size(self) -> int:
        return self.decoder.embed_tokens.weight.shape[1]

    def argmax_view(self) -> WhisperDecoderModel:
        """This model (weights and rules shared) with `step` logits exact only at each row's arg-max,
        through a two-stage bf16 / fp32 projection (`ArgmaxProjection`): for greedy decoding and
        greedy-verified methods on hardware with fast bf16 products. `prefill` stays exact (its
        begin-suppression changes which token is the arg-max)."""
        check(self.projection is None and self.exit_head is None, "an arg-max view is for the full model's projection")
        check(not self.quantized, "an arg-max view is for the fp32 projection (an int8 model's logits are its own)")
        readout = ArgmaxProjection(self.decoder.embed_tokens.weight, self._bias)
        return self._same_switches(WhisperDecoderModel(self.hf, self.suppress_tokens, self.begin_suppress_tokens,
                                                       cross_layers=self.cross_layers, argmax_readout=readout,
                                                       fixed_shape=self.fixed_shape))

    def feature_view(self, layers: tuple[int, ...]) -> WhisperDecoderModel:
        """This model (everything shared) with `state.hidden` [B, T, (m + 1) d]: the outputs of decoder
        layers `layers` (0-based, before any norm) and then the final hidden states, concatenated:
        the features an EAGLE head with fused layers reads (`EagleHead.read`)."""
        check(all(isinstance(i, int) and 0 <= i < self.num_layers for i in layers),
              f"feature layers must lie in [0, {self.num_layers - 1}], got {list(layers)}")
        view = copy.copy(self)
        view.feature_layers = tuple(sorted(set(layers)))
        return view

    def compile_graph(self, cache_dir=None, lazily: bool = False) -> bool:
        """Run this int8 target's passes (and its views') as one compiled graph that keeps the cache
        (`decoder_graph`); False (one warning line) where it cannot be built: the passes stay eager. `lazily`: built
        at the first state that needs it (True returned)."""
        self._graph.update(wanted=True, cache_dir=cache_dir)
        return lazily or self.graph is not None

    @property
    def graph(self) -> DecoderGraph | None:
        """The compiled pass states are held by (None: eager passes), built on first use."""
        box = self._graph
        if box["wanted"] and box["graph"] is None:
            box["wanted"] = False                     # one try: a failure has warned and the passes stay eager
            box["graph"] = DecoderGraph.of(self, box.get("cache_dir"))
        return box["graph"]

    @graph.setter
    def graph(self, graph: DecoderGraph | None) -> None:
        self._graph = {"wanted": False, "graph": graph}

    def eager(self) -> WhisperDecoderModel:
        """This model (everything shared) with eager passes only: for decoders that run its layers one by one."""
        view = copy.copy(self)
        view.graph = None
        return view

    def early_exit(self, exit_layer: int, head: nn.Module | None = None) -> WhisperDecoderModel:
        """A draft view: the first `exit_layer` decoder layers (weights shared), then `head` (an
        `ExitHead`; default: the final LayerNorm) and the tied projection."""
        return self._same_switches(WhisperDecoderModel(self.hf, self.suppress_tokens, self.begin_suppress_tokens,
                                                       exit_layer, head, quantized=self.quantized))

    def _same_switches(self, view: WhisperDecoderModel) -> WhisperDecoderModel:
        view.cuda_graphs = self.cuda_graphs
        return view

    # ---- audio --------------------------------------------------------------------------------

    @torch.inference_mode()
    def encode(self, features: Tensor, prompt: list[int] | list[list[int]], seconds: list[float] | None = None,
               encoder: nn.Module | None = None, rules: TimestampRules | None = None) -> EncodedAudio:
        """Run the encoder on log-mel `features` [B, mels, 3000]; every row gets `prompt` (or one each, of one length).
        `seconds`: each row's audio length (for drafts with a `cross_window`). `encoder`: another
        precision of the model's encoder, or its compiled form (`ASRPipeline.encoder`); its states are cast
        to the decoder's dtype. `rules`: decode in timestamp mode under these rules (every pass applies them)."""
        cfg = self.hf.config
        check(isinstance(features, Tensor) and features.dim() == 3 and features.shape[1] == cfg.num_mel_bins,
              f"features must be log-mel [batch, {cfg.num_mel_bins}, frames], got "
              f"{tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__}")
        check(len(prompt) > 0, "the decoder prompt needs at least <|startoftranscript|>")
        encoder = self.hf.model.encoder if encoder is None else encoder
        if isinstance(encoder, Compiled):               # fp32 in and out, on the host
            states = encoder(features).to(self.device, self.dtype)
        else:
            states = encoder(features.to(self.device, encoder.conv1.weight.dtype)).last_hidden_state.to(self.dtype)
        frames = None
        if seconds is not None:
            check(len(seconds) == features.shape[0],
                  f"seconds needs one length per row ({features.shape[0]}), got {len(seconds)}")
            window_s = features.shape[-1] / 100                     # 100 mel frames per second
            frames = torch.tensor([audio_frames(s, window_s, states.shape[1]) for s in seconds])
        return self.encoded(states, prompt, features=features, audio_frames=frames, rules=rules)

    def encoded(self, states: Tensor, prompt: list[int] | list[list[int]], *, features: Tensor | None = None,
                audio_frames: Tensor | None = None, rules: TimestampRules | None = None) -> EncodedAudio:
        """What `prefill` takes from encoder states [B, frames, d] already computed (`encode` runs the encoder)."""
        prompt_t = torch.tensor(prompt, dtype=torch.long).expand(states.shape[0], -1).contiguous()   # [B, P]
        # this model's key/value projections (its precision's) compute every entry, whoever reads it first
        projections = {self.cross_layers[i]: (ops.cross_kv, self.num_heads, self.head_dim)
                       for i, ops in enumerate(self._ops)}
        return EncodedAudio(states, prompt_t, features=features, audio_frames=audio_frames, rules=rules,
                            projections=projections)

    def _cross(self, inputs: EncodedAudio, i: int) -> tuple[Tensor, Tensor]:
        """Layer i's cross-attention keys/values [B, H, S, Dh] over the whole window (computed once, by the
        projection registered for the entry: the encoding model's)."""
        return inputs.cross_keys_values(self.cross_layers[i], self._ops[i].cross_kv, self.num_heads, self.head_dim)

    def _attended(self, inputs: EncodedAudio, i: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """What layer i cross-attends to: keys, values and a mask [B, 1, 1, S'] (None: all of them).
        Without a `cross_window` (or audio lengths) that is the whole window; with one, each row's
        audio frames plus `cross_window` more (the keys/values cut to the longest row, cached)."""
        k, v = self._cross(inputs, i)
        if self.cross_window is None or inputs.audio_frames is None:
            return k, v, None
        return inputs.audio_window(self.cross_layers[i], self.cross_window, k, v)

    # ---- decoding -----------------------------------------------------------------------------

    def new_state(self, batch_size: int, capacity: int, compiled: bool = True) -> DecodeState:
        """A state of `capacity` positions (all `max_positions` for a `fixed_shape` model: one key count always),
        held by the compiled pass when the model has one (`graph`) and `compiled`."""
        if self.fixed_shape:
            capacity = self.max_positions
        cache = self.graph.new_cache(batch_size, capacity) if self.graph is not None and compiled else None
        if cache is not None:
            return DecodeState(cache)
        return DecodeState(KVCache(self.num_layers, batch_size, self.num_heads, self.head_dim, capacity,
                                   dtype=self.dtype, device=self.device, full_width=self.fixed_shape))

    @torch.inference_mode()
    def prefill(self, inputs: EncodedAudio, room: int, run: bool = True, compiled: bool = False) -> DecodeState:
        """Run the prompt; `state.logits` [B, V] give the first transcript token (begin-suppressed).
        `run=False` only sets up the state (an empty eager cache with room for the prompt and `room` more, for
        passes that decide no token: scoring, alignment)."""
        check(isinstance(inputs, EncodedAudio), f"prefill takes EncodedAudio (from .encode), got {type(inputs).__name__}")
        check(isinstance(room, int) and room >= 0, f"room must be an int >= 0, got {room!r}")
        P = inputs.prompt.shape[1]
        capacity = min(P + room, self.max_positions)
        state = self.new_state(inputs.batch_size, capacity, compiled=run or compiled)
        state.extras["inputs"] = inputs
        if inputs.rules is not None:
            state.cache.keep_ids()                   # the timestamp rules read each row's tokens
        if not run:
            return state
        prompt = inputs.prompt.to(self.device)
        if self.argmax_readout is not None:          # exact at the arg-max, like `step`
            logits = self._forward(state, prompt, None, None, last_only=True,
                                   readout=lambda h: self.argmax_readout(h, self._begin_bias))
        else:
            logits = self._forward(state, prompt, None, None, last_only=True) + self._begin_bias
        state.logits = rule_logits(state, logits)[:, -1]
        return state

    @torch.inference_mode()
    def admit(self, state: DecodeState, row: int, inputs: EncodedAudio) -> DecodeState:
        """Row `row` of `state` (whose decoding has ended) starts over on `inputs` (one window, its prompt of the
        call's length); the other rows stay as they are. Returns the window's own one-row state (the logits of
        its first transcript token, its hidden states): a window that joins a call in progress (continuous
        batching)."""
        check(isinstance(inputs, EncodedAudio) and inputs.batch_size == 1,
              f"admit takes one window's EncodedAudio, got {type(inputs).__name__}")
        state.extras["inputs"].take_row(row, inputs)
        alone = self.prefill(inputs, 0)
        state.cache.take_row(row, alone.cache)
        return alone

    @torch.inference_mode()
    def prefill_with(self, inputs: EncodedAudio, room: int, tokens: Tensor) -> tuple[DecodeState, Tensor]:
        """`prefill` and `step(state, tokens)` in one pass: the prompt, then `tokens` [B, T] (drafts of
        the first transcript tokens). Returns the state (`room` counts from the prompt's end, as in
        `prefill`) and logits [B, 1 + T, V]: row 0 is `prefill`'s (begin-suppressed), row t + 1 what
        `step` returns after tokens[:, t] (exact only at the arg-max in an arg-max view)."""
        check(isinstance(inputs, EncodedAudio), f"prefill_with takes EncodedAudio (from .encode), got {type(inputs).__name__}")
        P = inputs.prompt.shape[1]
        state = self.prefill(inputs, room, run=False, compiled=True)
        check_step_args(state, tokens, None, self.vocab_size)
        check(tokens.shape[1] <= room, f"{tokens.shape[1]} tokens do not fit the room of {room}")
        bias = torch.cat([self._begin_bias[None], self._bias.expand(tokens.shape[1], -1)])      # [1 + T, V]
        seq = torch.cat([inputs.prompt.to(self.device), tokens.to(self.device)], 1)     # drafts never come back

        def scores(h: Tensor) -> Tensor:
            h = h[:, P - 1:]
            return self._project(h) + bias if self.argmax_readout is None else self.argmax_readout(h, bias)

        if isinstance(state.cache, GraphCache):
            logits = rule_logits(state, self._forward(state, seq, None, None)[:, P - 1:] + bias)
        else:
            logits = rule_logits(state, self._forward(state, seq, None, None, readout=scores))
        state.hidden = state.hidden[:, P - 1:]
        return state, logits

    @torch.inference_mode()
    def step(self, state: DecodeState, tokens: Tensor, positions: Tensor | None = None,
             tree_mask: Tensor | None = None, valid: Tensor | None = None) -> Tensor:
        """Append tokens [B, T]; returns suppressed logits [B, T, V] (row t predicts the token after t).
        `valid` [B]: only the first valid[b] tokens (tree nodes) of row b need logits; eager products skip the
        rest, whose logits are zeros (plus the suppression; the compiled pass, `graph`, computes them all at its one
        shape) and whose cache entries the caller rolls back (`skips_filler`)."""
        check_step_args(state, tokens, tree_mask, self.vocab_size)
        keep = kept_positions(tokens.shape, valid, self.device)

        def body(tokens: Tensor, positions: Tensor | None, tree_mask: Tensor | None) -> tuple[Tensor, Tensor]:
            if self.argmax_readout is not None:
                logits = self._forward(state, tokens, positions, tree_mask, readout=self.argmax_readout, keep=keep)
            else:
                logits = self._forward(state, tokens, positions, tree_mask, keep=keep) + self._bias
            return rule_logits(state, logits, tree_mask), state.hidden

        inputs = tuple(None if x is None else x.to(self.device) for x in (tokens, positions, tree_mask))
        if self.cuda_graphs and keep is None and state.cache.graphs_apply:
            logits, state.hidden = state.cache.graphs.run(step_key(inputs, self.argmax_readout is None), body, *inputs)
            return logits
        return body(*inputs)[0]

    @property
    def shortlist(self) -> Tensor | None:
        """The token ids [S] (ascending) outside which `step`'s logits are -inf, when it reads out through a
        shortlist; `shortlist_step` computes only those columns (drafts: no timestamp rules)."""
        return None if self.projection is None else self.projection.vocab

    @torch.inference_mode()
    def shortlist_step(self, state: DecodeState, tokens: Tensor, positions: Tensor | None = None,
                       tree_mask: Tensor | None = None) -> Tensor:
        """`step(...)[..., self.shortlist]` [B, T, S], without building the full-vocabulary logits."""
        check(self.projection is not None, "shortlist_step needs a model that reads out through a shortlist")
        check_step_args(state, tokens, tree_mask, self.vocab_size)
        bias = self._shortlist_bias
        return self._forward(state, tokens.to(self.device), positions, tree_mask,
                             readout=lambda h: self.projection.compact(h) + bias)

    @torch.inference_mode()
    def teacher_forced(self, inputs: EncodedAudio, tokens: Tensor) -> tuple[Tensor, list[Tensor]]:
        """One causal pass over prompt + `tokens` [B, T] (right-padded rows are fine: padding comes
        last). Returns the final hidden states [B, P + T, d] and each layer's output [B, P + T, d]
        (before any norm): the training inputs of Medusa and exit heads."""
        state = self.new_state(inputs.batch_size, inputs.prompt.shape[1] + tokens.shape[1])
        state.extras["inputs"] = inputs
        layers: list[Tensor] = []
        seq = torch.cat([inputs.prompt, tokens.cpu()], 1).to(self.device)
        self._forward(state, seq, None, None, last_only=True, layer_outputs=layers, any_shape=True)
        return state.hidden, layers

    def _forward(self, state: DecodeState, tokens: Tensor, positions: Tensor | None, tree_mask: Tensor | None,
                 last_only: bool = False, layer_outputs: list | None = None, readout=None,
                 keep: Tensor | None = None, probe: dict | None = None, any_shape: bool = False) -> Tensor:
        """One pass over `tokens` [B, T] -> logits (`readout`, default the vocabulary projection). `probe`: a
        dict that gets each layer's cross-attention queries (word alignment reads them). `any_shape`: a pass whose
        outputs decide no token (scoring or aligning a finished transcript) runs torch's attention kernel even in
        a `fixed_shape` model (faster over many queries; the same transcript still gets the same scores)."""
        if isinstance(state.cache, GraphCache):
            check(readout is None and layer_outputs is None and probe is None and not any_shape,
                  "a compiled decoder state runs plain passes only")
            logits, hidden = self.graph.run(self, state, tokens, positions, tree_mask)
            d = self.hidden_size           # hidden: every layer's output, then the final states
            parts = [hidden[..., i * d : (i + 1) * d] for i in self.feature_layers] + [hidden[..., -d:]]
            state.hidden = torch.cat(parts, -1) if self.feature_layers else parts[-1]
            return logits[:, -1:] if last_only else logits
        h, step = self.embed(state, tokens, positions, tree_mask)
        step.probe = probe
        if any_shape:
            step.attend = F.scaled_dot_product_attention
        if keep is not None:                # the kept positions only, packed [N, d] (see LayerStep)
            B, T = tokens.shape
            step.keep, step.shape = keep, (B, T)
            h = h.reshape(B * T, -1).index_select(0, keep)
        features = []
        for i in range(self.num_layers):
            h = self.layer(i, h, step)
            if layer_outputs is not None:
                layer_outputs.append(h)
            if i in self.feature_layers:
                features.append(h)
        h = self.exit_head(h) if self.exit_head is not None else self.decoder.layer_norm(h)
        hidden = torch.cat(features + [h], -1) if features else h
        if keep is not None:
            logits = (readout or self._project)(h)
            state.hidden = step.unpack(hidden)
            return step.unpack(logits)
        logits = (readout or self._project)(h[:, -1:] if last_only else h)
        state.hidden = hidden
        return logits

    # The three parts of a forward pass, public for decoders that run layers selectively (CALM).

    def embed(self, state: DecodeState, tokens: Tensor, positions: Tensor | None = None,
              tree_mask: Tensor | None = None) -> tuple[Tensor, LayerStep]:
        """Claim cache slots for `tokens` [B, T]; returns the input hidden states [B, T, d] and
        what every layer of this pass shares (cache writer, attention mask, audio)."""
        check(not isinstance(state.cache, GraphCache), "a compiled decoder state runs whole passes only: run the "
              "layers one by one on the model's eager view (`model.eager()`)")
        step, start = self.begin(state, tokens.shape[1], tree_mask)
        step.write.record(tokens)
        return self.embedded(state, tokens, positions, start, tree_mask, step.write.start), step

    def embedded(self, state: DecodeState, tokens: Tensor, positions: Tensor | None, start: Tensor,
                 tree_mask: Tensor | None, first: int | None = None) -> Tensor:
        """The input hidden states [B, T, d] of `tokens` [B, T] written after rows of lengths `start` [B] (`first`:
        their common length, when they are level): token and position embeddings."""
        T = tokens.shape[1]
        table = self.decoder.embed_positions.weight
        beyond = f"Whisper's decoder has {self.max_positions} positions; this transcript would exceed them"
        if positions is None and tree_mask is None and first is not None:
            check(first + T <= self.max_positions, beyond)     # rows at one common start: one slice of the table
            pos = table[first : first + T]
        else:
            if positions is None:
                positions = default_positions(start, T, tree_mask)
            positions = positions.to(self.device)
            expect(positions < self.max_positions, beyond)
            pos = table[positions.clamp(max=self.max_positions - 1)]
        h = F.embedding(self.as_read(state, tokens), self.decoder.embed_tokens.weight)
        if self.embed_scale != 1.0:
            h = h * self.embed_scale
        return h + pos

    def as_read(self, state: DecodeState, tokens: Tensor) -> Tensor:
        """`tokens` as this model embeds them: a draft (`reads_timestamps_as_none`) decoding in timestamp mode reads
        every timestamp as <|notimestamps|>, so that the transcript it sees is the one it was trained on (the first
        timestamp stands where <|notimestamps|> ends the prompt without timestamps); the cache keeps the real ids."""
        rules = state.extras["inputs"].rules if self.reads_timestamps_as_none and "inputs" in state.extras else None
        return tokens if rules is None else tokens.clamp(max=rules.no_timestamps)

    def opening(self, inputs: EncodedAudio) -> Tensor | None:
        """The first transcript tokens [B, W] a draft that reads timestamps as <|notimestamps|> takes as given when
        it drafts ahead of the target's prefill: in timestamp mode <|0.00|> (the usual first timestamp; read as
        <|notimestamps|>, after which the draft was trained to guess the text), so that its first drafts are
        <|0.00|> and the text after it. None: it drafts from the prompt alone."""
        rules = inputs.rules if self.reads_timestamps_as_none else None
        return None if rules is None else torch.full((inputs.batch_size, 1), rules.timestamp_begin, device=self.device)

    def begin(self, state: DecodeState, num_new: int, tree_mask: Tensor | None = None) -> tuple[LayerStep, Tensor]:
        """Claim `num_new` cache slots per row; returns the pass's `LayerStep` and the old lengths [B]
        (for layers fed hidden states instead of tokens: the Medusa block)."""
        write, start = state.cache.reserve(num_new)
        if num_new == 1 and tree_mask is None and write.same_start and not state.cache.full_width:
            mask = None             # one new token after rows of equal length sees every used slot
        else:
            mask = state.cache.attention_mask(start, num_new, tree_mask)
        return LayerStep(write, mask, state.extras["inputs"], self.num_heads, attend=self._attend), start

    def layer(self, i: int, h: Tensor, step: LayerStep, rows: Tensor | None = None) -> Tensor:
        """Decoder layer i on h [B, T, d] (un-normalised residual stream); writes this position's
        keys/values of every row into the cache. With `rows` (indices), only those rows go on
        through attention and the MLP; the others only get their keys/values written from their
        current h (CALM's state propagation for rows that exited) and come back unchanged."""
        layer, ops = self.decoder.layers[i], self._ops[i]
        check(rows is None or step.keep is None, "a pass runs either selected rows or kept positions, not both")
        check(rows is None or step.inputs.group == 1, "a pass over selected rows needs a window per row")
        x = _norm(layer.self_attn_layer_norm, h)
        q, k, v = ops.qkv(x)
        k, v = step.write.update(step.heads(k), step.heads(v), i)
        ck, cv, cmask = self._attended(step.inputs, i)
        out, mask = h, step.mask
        if rows is not None and rows.numel() == 0:
            return out
        if rows is not None:
            h, q, k, v, ck, cv = (t.index_select(0, rows) for t in (h, q, k, v, ck, cv))
            mask, cmask = (None if m is None else m.index_select(0, rows) for m in (mask, cmask))
        x = step.attend(step.heads(q), k, v, mask)
        h = h + ops.out(step.merge(x))
        x = _norm(layer.encoder_attn_layer_norm, h)
        q = step.heads(ops.cross_q(x))
        if step.probe is not None:           # the queries word alignment reads (`alignment`)
            step.probe[i] = q
        x = _cross_attention(step.attend, q.to(ck.dtype), ck, cv, cmask, step.inputs.group)
        h = h + ops.cross_out(step.merge(x.to(h.dtype)))
        h = h + ops.mlp(_norm(layer.final_layer_norm, h))
        if rows is None:
            return h
        return out.index_copy(0, rows, h)

    def readout(self, state: DecodeState, h: Tensor, last_only: bool = False) -> Tensor:
        """Normalised hidden states [B, T, d] -> logits [B, T (or 1), V] (kept in `state.hidden`)."""
        state.hidden = h
        return self._project(h[:, -1:] if last_only else h)

    def _project(self, h: Tensor) -> Tensor:
        if self.projection is not None:
            return self.projection(h).float()
        if self._int8_projection is not None:
            return self._int8_projection(h).float()
        return project(h, self.decoder.embed_tokens.weight).float()

    def select_rows(self, state: DecodeState, index: Tensor) -> None:
        """Keep rows `index` [B'] of `state` (cache and audio), in that order: beam search."""
        state.cache.select_rows(index)
        inputs: EncodedAudio = state.extras["inputs"]
        state.extras["inputs"] = inputs.select_rows(index, self.device)


def _cross_attention(attend, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, group: int) -> Tensor:
    """Queries q [B, H, T, Dh] over keys/values [B / group, H, S, Dh] by `attend` (sdpa's signature): each `group`
    consecutive rows ask their window's keys as one row of group * T queries (cross-attention has no causal mask)."""
    if group == 1:
        return attend(q, k, v, mask)
    B, H, T, D = q.shape
    q = q.view(B // group, group, H, T, D).transpose(1, 2).reshape(B // group, H, group * T, D)
    x = attend(q, k, v, mask)
    return x.view(B // group, H, group, T, D).transpose(1, 2).reshape(B, H, T, D)
