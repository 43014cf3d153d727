"""The Whisfusion decoder: Whisper's own decoder turned into a bidirectional masked-diffusion denoiser.

Whisfusion (arXiv 2508.07048) puts a masked-diffusion text decoder on a frozen Whisper encoder,
joined by cross-attention, and decodes every position of the transcript in parallel over a few
refinement steps instead of one token per pass. Here the decoder starts from the Whisper decoder of
the same checkpoint, whose cross-attention already reads this encoder: its causal self-attention
is opened up (every position sees every other), masked positions read a learned `[MASK]` embedding,
and it is fine-tuned to predict the clean tokens of masked positions (`mmaccel.speech.whisfusion.train`).
The token embedding (tied to the output) and the cross-attention key/value projections of the
encoder states stay frozen at Whisper's; everything else is trained.

Cross-attention reads the encoder states of the window's audio plus `cross_margin` (50) more, not the
padding of Whisper's 30-s window (`audio_frames`): a short clip costs a fraction of a full window.

Canvas: the Whisper prompt (`<|startoftranscript|>` ... `<|notimestamps|>`), then `canvas_length(seconds)`
positions: the transcript's tokens, then `<|endoftext|>` up to the end. Its length follows the audio
(`tokens_per_second` measured on the training windows, plus a margin), so no pass has a fixed maximum
length; one window is at most Whisper's 30 s (`max_target_positions` caps it).

A trained decoder is a directory: `whisfusion.safetensors` (the trained tensors, fp16) and
`whisfusion.json` (format, the Whisper source, `tokens_per_second`, margin, training info).
"""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.errors import InputError, ModelNotFoundError, check

FORMAT, FORMAT_VERSION = "mmaccel-whisfusion", 1
WEIGHTS_FILE, CONFIG_FILE = "whisfusion.safetensors", "whisfusion.json"
MASK = -1                       # token id of a masked canvas position
TRAINED_PADDING = "silence"     # the log-mel padding (`audio.log_mel`) the shipped decoder was trained on
SHORTLIST = "shortlist"         # the tensor of output ids in a saved file


class WhisfusionDecoder(nn.Module):
    """A bidirectional copy of `whisper.model.decoder` (`whisper`: a `WhisperForConditionalGeneration`)
    with a `[MASK]` embedding; `forward` returns logits over Whisper's vocabulary."""

    def __init__(self, whisper, tokens_per_second: float = 6.0, margin: int = 6, cross_margin: int = 50):
        super().__init__()
        decoder = getattr(getattr(whisper, "model", None), "decoder", None)
        check(decoder is not None and hasattr(decoder, "layers"),
              f"{type(whisper).__name__} is not a Whisper encoder-decoder (expected .model.decoder with layers)")
        # trainable whatever the source's flags (a pipeline with drafts loaded has frozen its model)
        self.decoder = copy.deepcopy(decoder).float().train(False).requires_grad_(True)
        cfg = whisper.config
        self.num_heads, self.d_model = cfg.decoder_attention_heads, cfg.d_model
        self.max_positions = cfg.max_target_positions
        self.mask_embedding = nn.Parameter(self.decoder.embed_tokens.weight.detach().mean(0).clone())
        self.tokens_per_second, self.margin = float(tokens_per_second), int(margin)
        # the token ids decoding may write (None: every id up to <|endoftext|>); the training
        # transcripts' tokens for a trained decoder, so each step's read-out is a few thousand rows
        self.shortlist: Tensor | None = None
        self.cross_margin = int(cross_margin)
        self.frames_per_second = cfg.max_source_positions / 30.0          # 50 encoder states a second
        for p in self.frozen_parameters():
            p.requires_grad_(False)

    def frozen_parameters(self) -> list[nn.Parameter]:
        """Whisper's tied token embedding and the cross-attention key/value projections."""
        out = [self.decoder.embed_tokens.weight]
        for layer in self.decoder.layers:
            out += list(layer.encoder_attn.k_proj.parameters()) + list(layer.encoder_attn.v_proj.parameters())
        return out

    def trained_state(self) -> dict[str, Tensor]:
        """The tensors training changes (what a saved decoder holds): every parameter but the frozen."""
        return {name: p for name, p in self.named_parameters() if p.requires_grad}

    def canvas_length(self, seconds: float, prompt_length: int) -> int:
        """Canvas positions for `seconds` of audio (at least 1, within Whisper's target positions)."""
        want = math.ceil(self.tokens_per_second * max(0.0, seconds)) + self.margin
        return max(1, min(want, self.max_positions - prompt_length))

    def audio_frames(self, seconds: float, total: int) -> int:
        """Encoder states a window of `seconds` of audio cross-attends to: its audio's states and
        `cross_margin` more (the rest of Whisper's 30-s window is padding the decoder need not read)."""
        return max(1, min(total, math.ceil(self.frames_per_second * max(0.0, seconds)) + self.cross_margin))

    def cut_states(self, encoder_states: Tensor, seconds: list[float]) -> tuple[Tensor, Tensor]:
        """The states of a batch cut to its longest `audio_frames` and the cross-attention padding [B, S]
        (True beyond each row's own frames)."""
        host = [self.audio_frames(s, encoder_states.shape[1]) for s in seconds]
        frames = torch.tensor(host, device=encoder_states.device)
        S = max(host)
        return encoder_states[:, :S], torch.arange(S, device=frames.device)[None] >= frames[:, None]

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, N] (MASK = -1 for masked positions) -> input states [B, N, d]."""
        masked = tokens == MASK
        x = self.decoder.embed_tokens(tokens.clamp_min(0))
        x = torch.where(masked[..., None], self.mask_embedding.to(x.dtype), x)
        return x + self.decoder.embed_positions.weight[: tokens.shape[1]].to(x.dtype)

    def cross_kv(self, encoder_states: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each layer's cross-attention keys/values [B, H, S, Dh] (frozen projections, no gradient)."""
        B, S, _ = encoder_states.shape
        out = []
        with torch.no_grad():
            for layer in self.decoder.layers:
                attn = layer.encoder_attn
                k = attn.k_proj(encoder_states).view(B, S, self.num_heads, -1).transpose(1, 2)
                v = attn.v_proj(encoder_states).view(B, S, self.num_heads, -1).transpose(1, 2)
                out.append((k, v))
        return out

    def hidden(self, tokens: Tensor, cross: list[tuple[Tensor, Tensor]], key_padding: Tensor | None = None,
               cross_padding: Tensor | None = None, causal: bool = False) -> Tensor:
        """Final hidden states [B, N, d]. `key_padding` [B, N] True where a position is padding (no
        other position attends to it); `cross_padding` [B, S] True at encoder states not attended to.
        `causal`: Whisper's own causal mask (the weights then compute exactly what the Whisper
        decoder does; used to check this forward against it)."""
        B, N = tokens.shape
        x = self.embed(tokens)
        mask = None if key_padding is None else (~key_padding)[:, None, None, :]
        cross_mask = None if cross_padding is None else (~cross_padding)[:, None, None, :]
        if causal:
            tril = torch.ones(N, N, dtype=torch.bool, device=tokens.device).tril()[None, None]
            mask = tril if mask is None else mask & tril
        for layer, (ck, cv) in zip(self.decoder.layers, cross):
            h = layer.self_attn_layer_norm(x)
            x = x + _attend(layer.self_attn, h, None, None, self.num_heads, mask)
            h = layer.encoder_attn_layer_norm(x)
            x = x + _attend(layer.encoder_attn, h, ck, cv, self.num_heads, cross_mask)
            h = layer.final_layer_norm(x)
            x = x + layer.fc2(F.gelu(layer.fc1(h)))
        return self.decoder.layer_norm(x)

    def logits(self, hidden: Tensor) -> Tensor:
        return F.linear(hidden, self.decoder.embed_tokens.weight)

    def forward(self, tokens: Tensor, encoder_states: Tensor, key_padding: Tensor | None = None,
                cross_padding: Tensor | None = None) -> Tensor:
        return self.logits(self.hidden(tokens, self.cross_kv(encoder_states), key_padding, cross_padding))

    # ---- files ----------------------------------------------------------------------------------

    def output_ids(self, end_of_text: int) -> Tensor:
        """The token ids decoding reads out: the shortlist, else every id up to `end_of_text`."""
        device = self.decoder.embed_tokens.weight.device
        if self.shortlist is None:
            return torch.arange(end_of_text + 1, device=device)
        return self.shortlist.to(device)

    def save(self, path: str | os.PathLike, source: str, info: dict | None = None) -> Path:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().half().contiguous() for k, v in self.trained_state().items()}
        if self.shortlist is not None:
            tensors[SHORTLIST] = self.shortlist.to(torch.int64).contiguous()
        save_file(tensors, str(path / WEIGHTS_FILE))
        config = {"format": FORMAT, "version": FORMAT_VERSION, "whisper": source,
                  "tokens_per_second": self.tokens_per_second, "margin": self.margin,
                  "cross_margin": self.cross_margin, "info": info or {}}
        (path / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, whisper) -> WhisfusionDecoder:
        """The decoder saved in `path`, on `whisper` (the model it was trained on)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(path)
        config = read_config(path)
        model = cls(whisper, config["tokens_per_second"], config["margin"], config["cross_margin"])
        try:
            state = load_file(str(path / WEIGHTS_FILE))
        except (OSError, SafetensorError) as err:
            raise ModelNotFoundError(f"{path / WEIGHTS_FILE}: unreadable Whisfusion weights ({err})") from None
        if SHORTLIST in state:
            model.shortlist = state.pop(SHORTLIST).long()
        want = model.trained_state()
        missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
        check(not missing and not extra, f"{path / WEIGHTS_FILE} does not fit {config['whisper']}'s decoder: "
              f"missing {missing[:4]}, unexpected {extra[:4]}")
        for k, v in state.items():
            check(v.shape == want[k].shape, f"{path / WEIGHTS_FILE}: {k} has shape {tuple(v.shape)}, the model "
                  f"{tuple(want[k].shape)}; it was trained on another Whisper than {config['whisper']}")
        model.load_state_dict({**model.state_dict(), **{k: v.float() for k, v in state.items()}})
        return model.eval()


def read_config(path: Path) -> dict:
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise ModelNotFoundError(f"{path} holds no Whisfusion decoder ({CONFIG_FILE} not found)")
    try:
        config = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"{file}: not valid JSON ({err})") from None
    check(config.get("format") == FORMAT, f"{file}: format {config.get('format')!r}, expected {FORMAT!r}")
    check(config.get("version") == FORMAT_VERSION, f"{file}: version {config.get('version')}, this mmaccel reads "
          f"{FORMAT_VERSION}")
    return config


def _attend(attn, h: Tensor, k: Tensor | None, v: Tensor | None, heads: int, mask: Tensor | None) -> Tensor:
    """One Whisper attention block (self-attention when k, v are None), no causal mask."""
    B, N, d = h.shape
    q = attn.q_proj(h).view(B, N, heads, -1).transpose(1, 2)
    if k is None:
        k = attn.k_proj(h).view(B, N, heads, -1).transpose(1, 2)
        v = attn.v_proj(h).view(B, N, heads, -1).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return attn.out_proj(out.transpose(1, 2).reshape(B, N, d))
