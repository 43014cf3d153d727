"""A character CTC model on the frozen Whisper encoder, with a head after several encoder layers.

Whisper's encoder is a strong acoustic model; a small CTC head on its states transcribes without the
autoregressive decoder (the CTC-on-a-pretrained-encoder recipe of wav2vec2 fine-tuning, Baevski et al.
2020, here with the encoder frozen). Heads on intermediate layers give early exit: an utterance a
shallow head is sure of never runs the later layers (`mmaccel.speech.ctc.early_exit`).

Variable-length windows: Whisper pads every clip to 30 s (3000 mel frames, 1500 encoder positions)
because its decoder was trained on such windows. A CTC head trained here on unpadded features does not
need that: `encode_variable` runs the encoder on each clip's own frames (padded to the batch's longest,
with the padded keys masked out of self-attention), so a 5 s clip costs ~1/6 of the encoder. This
departs from Whisper's own 30 s windows: the states differ from those of a padded window, which is fine
for heads trained on them, not for Whisper's decoder.

Labels (`CHARACTERS`): blank `_` (0), the word delimiter `|` (1), `a`..`z` and `'`; targets and WER
references are `normalize_text`-ed. One encoder frame is two 10 ms mel frames: `frame_seconds` 0.02.

A trained model is a directory: `ctc_heads.safetensors` (the heads, fp16) and `ctc.json` (format
`mmaccel-whisper-ctc`, the Whisper source, exit layers, head sizes, tokens and a training-info dict);
`WhisperCTC.load(dir)` rebuilds it on the recorded Whisper.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmaccel.errors import InputError, ModelNotFoundError, check
from mmaccel.speech.audio import SAMPLE_RATE, WINDOW_S, Audio, AudioLike, as_audio
from mmaccel.speech.ctc.early_exit import CRITERIA, EarlyExitResult, confident, mask_padding, utterance_confidence
from mmaccel.speech.ctc.vocab import CTCVocabulary

CHARACTERS = ("_", "|", *"abcdefghijklmnopqrstuvwxyz", "'")
FORMAT = "mmaccel-whisper-ctc"
FORMAT_VERSION = 1
HEADS_FILE, CONFIG_FILE = "ctc_heads.safetensors", "ctc.json"
FRAME_SECONDS = 0.02          # conv2's stride 2 over 10 ms mel frames
MIN_SAMPLES = 400             # one STFT window (25 ms): shorter clips have no mel frame of their own

_SEPARATORS = re.compile(r"[\s\-\u2010-\u2015/_]+")
_NOT_LABEL = re.compile(r"[^a-z' ]+")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'", "\u02bc": "'"})


def character_vocab() -> CTCVocabulary:
    """The 29 labels: blank `_` (id 0), delimiter `|` (id 1), `a`..`z`, `'`."""
    return CTCVocabulary(CHARACTERS, blank=0, delimiter="|")


def normalize_text(text: str) -> str:
    """Lowercase; accents stripped; hyphens, dashes, slashes, underscores and whitespace to single
    spaces; every other character not in a-z or `'` (punctuation, digits) dropped. The form of the
    character heads' training targets."""
    check(isinstance(text, str), f"text must be a string, got {type(text).__name__}")
    text = unicodedata.normalize("NFKD", text.translate(_APOSTROPHES))
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).lower()
    text = _NOT_LABEL.sub("", _SEPARATORS.sub(" ", text))
    return " ".join(text.split())


def default_exit_layers(num_layers: int) -> tuple[int, ...]:
    """Every layer for encoders of up to 3 layers, else every second one ending at the last: (2, 4, 6) for base."""
    if num_layers <= 3:
        return tuple(range(1, num_layers + 1))
    return tuple(range(2 - num_layers % 2, num_layers + 1, 2))


# ---- the encoder on windows shorter than 30 s --------------------------------------------------


def log_mel_variable(feature_extractor, audios: Sequence[Audio]) -> tuple[Tensor, Tensor]:
    """Whisper log-mel features of each clip at its own length: features [B, mels, F] and frame counts [B].

    Each clip is zero-padded to the longest clip (to F * hop samples if longer), F = the longest
    clip's frame count (samples // hop) rounded up to even, and featurised by the feature extractor
    itself, so a clip's frames are those of its 30 s window (its padding frames are what the
    extractor pads with: log-mel of silence) up to F instead of 3000.
    """
    check(isinstance(audios, (list, tuple)) and len(audios) > 0, "no audio to featurise")
    hop = feature_extractor.hop_length
    for a in audios:
        check(isinstance(a, Audio), f"give Audio objects (mmaccel.speech.audio.as_audio), got {type(a).__name__}")
        check(a.duration <= WINDOW_S + 1e-6, f"{a.source}: {a.duration:.1f} s is longer than Whisper's "
              f"{WINDOW_S:.0f} s window; split it with mmaccel.speech.audio.split_long first")
        check(len(a.samples) >= MIN_SAMPLES, f"{a.source}: {len(a.samples)} samples is shorter than one "
              f"{MIN_SAMPLES}-sample (25 ms) analysis window")
    frames = [len(a.samples) // hop for a in audios]
    width = max(frames) + max(frames) % 2                       # conv2 has stride 2: an even frame count
    samples = max(width * hop, max(len(a.samples) for a in audios))     # -> exactly `width` frames
    padded = np.zeros((len(audios), samples), dtype=np.float32)
    for row, a in zip(padded, audios):
        row[:len(a.samples)] = a.samples
    features = feature_extractor(list(padded), sampling_rate=SAMPLE_RATE, return_tensors="pt",
                                 padding="longest")["input_features"]
    check(features.shape[-1] == width, f"the feature extractor gave {features.shape[-1]} frames for {samples} "
          f"samples, expected {width}: is its hop length {hop}?")
    return features, torch.tensor(frames)


def _stem(encoder, features: Tensor, lengths_frames: Tensor) -> tuple[Tensor, Tensor]:
    """The convolutional front end plus positions: hidden [B, F // 2, d] and encoder frame counts [B].

    Frames past a row's length are zeroed first: a conv then sees the zeros its own padding would give
    that row alone, so a row's states do not depend on how far the batch padded it."""
    B, mels, Fr = features.shape
    check(mels == encoder.conv1.in_channels, f"features have {mels} mel bins, this Whisper takes "
          f"{encoder.conv1.in_channels}")
    check(Fr % 2 == 0 and Fr >= 2, f"the mel frame count must be even (conv2 has stride 2), got {Fr}")
    T = Fr // 2
    check(T <= encoder.config.max_source_positions,
          f"{Fr} mel frames make {T} encoder positions, more than this Whisper's max_source_positions "
          f"{encoder.config.max_source_positions} ({encoder.config.max_source_positions * FRAME_SECONDS:.1f} s); "
          "split the audio")
    lengths_frames = torch.as_tensor(lengths_frames, device=features.device).long()
    check(tuple(lengths_frames.shape) == (B,) and bool(((lengths_frames >= 1) & (lengths_frames <= Fr)).all()),
          f"lengths_frames must be [{B}] frame counts in [1, {Fr}], got {lengths_frames.tolist()}")
    param = encoder.conv1.weight
    inside = torch.arange(Fr, device=features.device)[None] < lengths_frames[:, None]
    x = (features * inside[:, None, :]).to(param.device, param.dtype)
    x = F.gelu(encoder.conv2(F.gelu(encoder.conv1(x))))                                # [B, d, T]
    hidden = x.permute(0, 2, 1) + encoder.embed_positions.weight[:T]
    return hidden, ((lengths_frames + 1) // 2).to(param.device)


def _attention_mask(lengths: Tensor, T: int, dtype: torch.dtype) -> Tensor | None:
    """Additive key-padding mask [B, 1, T, T] (the minimum float at padded keys), or None when no row is padded."""
    if bool((lengths >= T).all()):
        return None
    pad = torch.arange(T, device=lengths.device)[None] >= lengths[:, None]               # [B, T]
    mask = torch.zeros(pad.shape, dtype=dtype, device=lengths.device).masked_fill(pad, torch.finfo(dtype).min)
    return mask[:, None, None, :].expand(-1, 1, T, -1)


def _run_layers(encoder, hidden: Tensor, lengths: Tensor, start: int, stop: int) -> Tensor:
    """Encoder layers start+1 .. stop (1-based) over hidden [B, T, d]."""
    mask = _attention_mask(lengths, hidden.shape[1], hidden.dtype)
    for layer in encoder.layers[start:stop]:
        hidden = layer(hidden, mask)
    return hidden


def _exit_states(encoder, hidden: Tensor, layer: int) -> Tensor:
    """The states a head at `layer` reads: the layer's output, through the final layer norm after the last layer."""
    return encoder.layer_norm(hidden) if layer == len(encoder.layers) else hidden


def encode_variable(encoder, features: Tensor, lengths_frames: Tensor,
                    layers: Sequence[int]) -> tuple[dict[int, Tensor], Tensor]:
    """Run a Hugging Face `WhisperEncoder` on mel windows shorter than 30 s.

    features: [B, mels, F] log-mel (F even, F // 2 <= max_source_positions); lengths_frames: [B] each
    row's mel frames. Returns {k: hidden [B, F // 2, d]} for each k in `layers` (k = the output of the
    first k encoder layers; k = the number of layers includes the final layer norm) and the encoder
    frame counts [B] (ceil(frames / 2)). Padded frames are zeroed before the convolutions and masked
    out of self-attention, so each row's states equal those of the row run alone at its own length.
    """
    n = len(encoder.layers)
    layers = sorted(set(layers))
    check(len(layers) > 0 and all(isinstance(k, int) and 1 <= k <= n for k in layers),
          f"layers must be encoder layer numbers in 1..{n}, got {list(layers)}")
    check(isinstance(features, Tensor) and features.dim() == 3, "features must be a tensor [batch, mels, frames]")
    hidden, lengths = _stem(encoder, features, lengths_frames)
    out, done = {}, 0
    for k in layers:
        hidden = _run_layers(encoder, hidden, lengths, done, k)
        out[k], done = _exit_states(encoder, hidden, k), k
    return out, lengths


# ---- the heads ----------------------------------------------------------------------------------


class CTCHead(nn.Module):
    """LayerNorm -> Linear(stride * d, width) over `stride` adjacent frames stacked -> GELU -> `layers`
    pre-norm Transformer layers -> LayerNorm -> Linear(width, V): a small contextual model over one
    encoder layer's states, one output frame per `stride` encoder frames (stride 2: 40 ms frames, half
    the steps of a frame-synchronous decoder). No positional encoding: the encoder states carry Whisper's."""

    def __init__(self, d_model: int, vocab_size: int, width: int = 256, heads: int = 4, layers: int = 2,
                 dropout: float = 0.1, stride: int = 1):
        super().__init__()
        check(width % heads == 0, f"the head width {width} must be a multiple of its attention heads {heads}")
        check(isinstance(stride, int) and stride >= 1, f"the head stride must be an int >= 1, got {stride!r}")
        self.stride = stride
        self.norm_in = nn.LayerNorm(d_model)
        self.proj = nn.Linear(stride * d_model, width)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(width, heads, 4 * width, dropout, activation="gelu",
                                                               batch_first=True, norm_first=True)
                                    for _ in range(layers))
        for layer in self.layers:
            # Dropout on the residual and feed-forward paths only: dropping attention weights draws a
            # [B, heads, T, T] mask, 40 % of a CPU training step on 20 s windows (measured).
            layer.self_attn.dropout = 0.0
        self.norm_out = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab_size)

    def out_lengths(self, lengths: Tensor) -> Tensor:
        """Output frames of inputs of `lengths` encoder frames (a partial last group counts)."""
        return (lengths + self.stride - 1) // self.stride

    def forward(self, hidden: Tensor, lengths: Tensor) -> Tensor:
        """hidden [B, T, d], lengths [B] -> logits [B, ceil(T / stride), V]; padded frames are zeroed
        before stacking and masked out of attention."""
        B, T, d = hidden.shape
        x = self.norm_in(hidden)
        if self.stride > 1:
            inside = torch.arange(T, device=hidden.device)[None, :, None] < lengths.to(hidden.device)[:, None, None]
            x = F.pad(x * inside, (0, 0, 0, (-T) % self.stride)).reshape(B, -1, self.stride * d)
        lengths = self.out_lengths(lengths.to(hidden.device))
        pad = torch.arange(x.shape[1], device=hidden.device)[None] >= lengths[:, None]
        x = F.gelu(self.proj(x))
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=pad)
        return self.out(self.norm_out(x))


class WhisperCTC(nn.Module):
    """CTC heads on a frozen Whisper encoder (the `CTCModel` interface: `vocab`, `frame_seconds`,
    `log_probs(audios)`), one head per exit layer in `heads` (keyed by the layer number as a string).

    whisper: a `WhisperBundle` (or anything with `.model`, a `WhisperForConditionalGeneration`, and
    `.feature_extractor`); source: the name `load` reloads it by (default `builtin:<bundle name>`).
    """

    def __init__(self, whisper, exit_layers: Sequence[int] | None = None, *, width: int = 256, heads: int = 4,
                 layers: int = 2, dropout: float = 0.1, stride: int = 1, source: str | None = None,
                 vocab: CTCVocabulary | None = None):
        super().__init__()
        encoder = whisper.model.get_encoder()
        self.encoder = encoder.eval().requires_grad_(False)
        self.feature_extractor = whisper.feature_extractor
        check(self.feature_extractor.feature_size == encoder.config.num_mel_bins,
              f"the feature extractor makes {self.feature_extractor.feature_size} mel bins, the encoder takes "
              f"{encoder.config.num_mel_bins}")
        self.source = source or f"builtin:{whisper.name}"
        self.vocab = vocab or character_vocab()
        self.frame_seconds = FRAME_SECONDS * stride
        self.num_layers, self.d_model = len(encoder.layers), encoder.config.d_model
        exits = tuple(sorted(set(exit_layers))) if exit_layers else default_exit_layers(self.num_layers)
        check(all(isinstance(k, int) and 1 <= k <= self.num_layers for k in exits),
              f"exit layers must be in 1..{self.num_layers} (this Whisper has {self.num_layers} encoder layers), "
              f"got {list(exits)}")
        self.exit_layers = exits
        self.head_config = {"width": width, "heads": heads, "layers": layers, "dropout": dropout, "stride": stride}
        self.heads = nn.ModuleDict({str(k): CTCHead(self.d_model, len(self.vocab), **self.head_config) for k in exits})
        self.heads.to(encoder.conv1.weight.device)
        self.info: dict = {}

    def train(self, mode: bool = True) -> WhisperCTC:
        super().train(mode)
        self.encoder.eval()                        # frozen: no dropout in the encoder, ever
        return self

    # -- inference ----------------------------------------------------------------------------------

    def features(self, audios: Sequence[AudioLike]) -> tuple[Tensor, Tensor]:
        """Log-mel features [B, mels, F] and frame counts [B] of 16 kHz audio, each at its own length."""
        check(isinstance(audios, (list, tuple)) and len(audios) > 0, "give a non-empty list of audio")
        return log_mel_variable(self.feature_extractor, [as_audio(a) for a in audios])

    def head_log_probs(self, layer: int, hidden: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Label log-probabilities [B, T', V] of the head at `layer` over its states [B, T, d] (0 past each
        length) and their frame counts [B] (T' = T / stride)."""
        head = self.heads[str(layer)]
        frames = head.out_lengths(lengths)
        return mask_padding(head(hidden.float(), lengths).float().log_softmax(-1), frames), frames

    @torch.inference_mode()
    def log_probs(self, audios: Sequence[AudioLike], exit_layer: int | None = None) -> tuple[Tensor, Tensor]:
        """Per-frame label log-probabilities [B, T, V] of the head at `exit_layer` (default: the last) and
        each row's frame count [B]; only the first `exit_layer` encoder layers run."""
        layer = self.exit_layers[-1] if exit_layer is None else exit_layer
        check(layer in self.exit_layers, f"no head at layer {layer}; the heads are at {list(self.exit_layers)}")
        hidden, lengths = encode_variable(self.encoder, *self.features(audios), (layer,))
        return self.head_log_probs(layer, hidden[layer], lengths)

    @torch.inference_mode()
    def log_probs_all(self, audios: Sequence[AudioLike]) -> dict[int, tuple[Tensor, Tensor]]:
        """{layer: (log_probs [B, T, V], lengths [B])} of every head, from one encoder pass."""
        hidden, lengths = encode_variable(self.encoder, *self.features(audios), self.exit_layers)
        return {k: self.head_log_probs(k, hidden[k], lengths) for k in self.exit_layers}

    @torch.inference_mode()
    def transcribe_early_exit(self, audios: Sequence[AudioLike], criterion: str = "entropy",
                              threshold: float = 0.1) -> EarlyExitResult:
        """Early exit with the later layers really skipped: every utterance runs to the first exit, the
        ones whose head is confident (`early_exit`'s rule) stop there, and only the rest (their rows
        gathered, trimmed to their longest) go on through the next layers. The same choices and
        log-probabilities as `early_exit(log_probs_all(audios), ...)`, at the cost of the layers run."""
        check(criterion in CRITERIA, f"criterion must be one of {', '.join(CRITERIA)}, got {criterion!r}")
        hidden, lengths = _stem(self.encoder, *self.features(audios))
        stride = self.head_config["stride"]
        B, T = hidden.shape[0], -(-hidden.shape[1] // stride)
        out = torch.zeros(B, T, len(self.vocab), device=hidden.device)
        chosen = torch.full((B,), self.exit_layers[-1], dtype=torch.long, device=hidden.device)
        rows, lens, done = torch.arange(B, device=hidden.device), lengths, 0
        for i, k in enumerate(self.exit_layers):
            hidden = _run_layers(self.encoder, hidden, lens, done, k)
            done = k
            lp, frames = self.head_log_probs(k, _exit_states(self.encoder, hidden, k), lens)
            last = i == len(self.exit_layers) - 1
            stop = torch.ones_like(lens, dtype=torch.bool) if last else \
                confident(utterance_confidence(lp, frames, criterion), criterion, threshold)
            out[rows[stop], :lp.shape[1]] = lp[stop]
            chosen[rows[stop]] = k
            if bool(stop.all()):
                break
            go = ~stop
            rows, lens = rows[go], lens[go]
            hidden = hidden[go, :int(lens.max())]
        return EarlyExitResult(chosen, out, (lengths + stride - 1) // stride)

    # -- files --------------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike, info: dict | None = None) -> Path:
        """Write `ctc_heads.safetensors` (the heads, fp16) and `ctc.json` into the directory `path`."""
        from safetensors.torch import save_file

        root = Path(path).expanduser()
        root.mkdir(parents=True, exist_ok=True)
        tensors = {name: t.detach().to("cpu", torch.float16).contiguous()
                   for name, t in self.heads.state_dict().items()}
        meta = {"format": FORMAT, "version": FORMAT_VERSION, "whisper": self.source, "d_model": self.d_model,
                "encoder_layers": self.num_layers, "exit_layers": list(self.exit_layers), "head": self.head_config,
                "tokens": self.vocab.tokens, "blank": self.vocab.blank, "delimiter": self.vocab.delimiter,
                "frame_seconds": self.frame_seconds, "info": info if info is not None else self.info}
        tmp = root / (HEADS_FILE + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": FORMAT})
        tmp.replace(root / HEADS_FILE)
        tmp = root / (CONFIG_FILE + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1), encoding="utf-8")
        tmp.replace(root / CONFIG_FILE)
        return root

    @classmethod
    def load(cls, path: str | os.PathLike, whisper=None) -> WhisperCTC:
        """A saved model; its Whisper is loaded by the recorded source (`load_whisper`) unless `whisper`
        (a bundle) is given. Raises ModelNotFoundError for missing files, InputError for corrupt ones
        or a Whisper the heads do not fit."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        root = Path(path).expanduser()
        config, weights = root / CONFIG_FILE, root / HEADS_FILE
        if not config.is_file():
            raise ModelNotFoundError(f"no Whisper CTC model at {root} ({CONFIG_FILE} missing); pass the directory "
                                     "WhisperCTC.save wrote, or train one with `python -m mmaccel.speech.ctc.train`")
        try:
            meta = json.loads(config.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise InputError(f"{config} is not valid JSON ({err}); re-export the model") from None
        check(isinstance(meta, dict) and meta.get("format") == FORMAT,
              f"{config} is not a {FORMAT} file (format {meta.get('format') if isinstance(meta, dict) else None!r})")
        missing = [k for k in ("whisper", "d_model", "exit_layers", "head", "tokens") if k not in meta]
        check(not missing, f"{config} lacks {', '.join(missing)}; re-export the model")
        if not weights.is_file():
            raise ModelNotFoundError(f"{root} has {CONFIG_FILE} but no {HEADS_FILE}; copy both files of the model")
        try:
            tensors = load_file(str(weights))
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise InputError(f"{weights} is not a readable safetensors file ({err}); re-export the model") from None
        if whisper is None:
            from mmaccel.speech.whisper import load_whisper

            whisper = load_whisper(meta["whisper"])
        d_model = whisper.model.config.d_model
        check(d_model == meta["d_model"], f"the heads in {root} read d_model {meta['d_model']} states "
              f"({meta['whisper']}), the given Whisper has d_model {d_model}: pass the Whisper they were trained on")
        vocab = CTCVocabulary(meta["tokens"], meta.get("blank", 0), meta.get("delimiter", "|"))
        model = cls(whisper, [int(k) for k in meta["exit_layers"]], **meta["head"], source=meta["whisper"], vocab=vocab)
        try:
            model.heads.load_state_dict(tensors)
        except RuntimeError as err:
            raise InputError(f"{weights} does not match {config} (exit layers {meta['exit_layers']}, head "
                             f"{meta['head']}): {str(err).splitlines()[0]}") from None
        model.info = meta.get("info") or {}
        return model.eval()
