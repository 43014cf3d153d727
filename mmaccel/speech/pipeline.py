"""ASRPipeline: a Whisper model (+ trained draft heads) and any speech decoding method.

>>> asr = ASRPipeline.from_pretrained("builtin:base")
>>> out = asr.transcribe(["a.wav", "b.flac"], method="medusa")
>>> out.texts, out.stats.nfe, out.rtfx

Audio longer than 30 s is cut at quiet points into windows that are transcribed in the same
batches as everything else and joined. A list input reports a bad file in its transcript's
`error` and still transcribes the rest; a single bad input raises.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmaccel.core.methods import Method, Resources
from mmaccel.core.model import on_host
from mmaccel.core.plugin import MethodPlugin
from mmaccel.core.quant import fast_bf16_matmul
from mmaccel.core.sampling import Sampling
from mmaccel.core.stats import DecodeStats
from mmaccel.devices import resolve_device, use_cuda_graphs
from mmaccel.errors import InputError, check
from mmaccel.paths import assets_dir
from mmaccel.speech.audio import Audio, AudioLike, as_audio, is_silent, log_mel, split_long
from mmaccel.speech.cross_draft import Assistant, new_assistant
from mmaccel.speech.decoder import WhisperDecoderModel
from mmaccel.speech.draft import WhisperDraft, load_draft
from mmaccel.speech.eagle import EagleDecoder, EagleHead
from mmaccel.speech.encoder_precision import check_precision, encoder_variant
from mmaccel.speech.heads import WhisperHeads, load_heads, merge_heads
from mmaccel.speech.methods import ASR_REGISTRY, build_asr_method
from mmaccel.speech.whisper import WhisperBundle, load_whisper

MAX_NEW_TOKENS = 224   # per 30-s window, as openai-whisper (half the decoder's 448 positions)


def builtin_heads_path(name: str) -> Path:
    return assets_dir() / f"whisper_{name}_heads.safetensors"


def builtin_eagle_path(name: str) -> Path:
    return assets_dir() / f"whisper_{name}_eagle.safetensors"


def heads_option(value: str) -> str | list[str] | None:
    """A command line's heads value ("auto", "none" or comma-separated files) as `from_pretrained` takes it."""
    return None if value == "none" else "auto" if value == "auto" else value.split(",")


def draft_option(value: str) -> str | None:
    """A command line's draft value ("auto", "none" or a file) as `from_pretrained` takes it."""
    return None if value == "none" else value


def builtin_draft_path(name: str) -> Path:
    return assets_dir() / f"whisper_{name}_draft.safetensors"


@dataclass
class Transcript:
    text: str
    source: str
    duration: float                 # seconds of audio
    tokens: list[int] = field(default_factory=list)   # generated ids of all windows (specials included)
    passes: int = 0                 # decoder target passes that committed its tokens (prefills included)
    error: str | None = None        # why this input could not be transcribed (list inputs only)


@dataclass
class ASROutput:
    transcripts: list[Transcript]
    stats: DecodeStats              # decoder counters; time_s also holds "features" and "encoder"
    method: str

    @property
    def texts(self) -> list[str]:
        return [t.text for t in self.transcripts]

    @property
    def audio_s(self) -> float:
        return sum(t.duration for t in self.transcripts if t.error is None)

    @property
    def wall_s(self) -> float:
        """Features + encoder + decoding: the Open ASR Leaderboard's transcription time."""
        return sum(self.stats.time_s.get(k, 0.0) for k in ("features", "encoder", "decode"))

    @property
    def rtfx(self) -> float:
        return self.audio_s / self.wall_s if self.wall_s > 0 else 0.0


class ASRPipeline:
    def __init__(self, bundle: WhisperBundle, heads: WhisperHeads | None = None, draft: WhisperDraft | None = None):
        check(isinstance(bundle, WhisperBundle), f"bundle must be a WhisperBundle, got {type(bundle).__name__}")
        self.bundle = bundle
        self.model = WhisperDecoderModel(bundle.model)
        # greedy decoding and greedy-verified methods read only arg-maxes: a bf16-first projection
        # whose arg-max is the fp32 one (`ArgmaxProjection`), on a CPU with native bf16 products (its
        # short list of candidates has a data-dependent size: on a GPU that would make every step wait
        # for the host, which costs more than the fp32 projection it saves)
        device = self.model.device
        self.argmax_model = self.model.argmax_view() if on_host(device) and fast_bf16_matmul(device) else self.model
        self.heads = heads or WhisperHeads()
        self.heads_source: str | None = None     # the heads files (comma-separated), when loaded from files
        self.draft = draft
        self.draft_source: str | None = None     # the draft decoder file, when loaded from one
        # the draft runs on int8 weights where that is a bandwidth saving (CPU); verification keeps
        # the output exact whatever the draft computes
        self._draft_model = None if draft is None else draft.decoder_model(self.model, quantized=self.model.device.type == "cpu")
        self.assistant: Assistant | None = None  # another Whisper, for speculative-cross
        self._eagle: tuple[EagleHead, EagleDecoder] | None = None     # built once per head (int8 on a CPU)
        self._encoders = {"fp32": bundle.model.model.encoder}            # precision -> encoder, built on first use

    @classmethod
    def from_pretrained(cls, source: str = "builtin:base", *, heads: str | os.PathLike | list | None = "auto",
                        draft: str | os.PathLike | None = "auto", assistant: str | None = None,
                        cache_dir: str | os.PathLike | None = None,
                        device: str | torch.device | None = None, cuda_graphs: bool = False) -> ASRPipeline:
        """`source`: "builtin:base", "builtin:tiny.en" or a local Hugging Face Whisper directory.

        `heads`: a heads file (Medusa, exit, Medusa-Block and/or EAGLE heads) or a list of them, each
        kind from one file; `draft`: a draft decoder file (for `speculative` / `tree`). "auto" loads
        the shipped files of a builtin model (heads, EAGLE head, draft decoder; or `heads.safetensors`,
        `eagle.safetensors`, `draft.safetensors` inside a local directory) when present; None loads none.
        `assistant`: another Whisper (a source like "builtin:tiny.en") for `speculative-cross`.
        `device`: cpu (default), cuda, cuda:N or auto; heads and drafts follow the model.
        `cuda_graphs`: replay the decoders' fixed-shape steps as CUDA graphs (a GPU only).
        """
        device = resolve_device(device)
        use_cuda_graphs(cuda_graphs, device)
        bundle = load_whisper(source, cache_dir)
        bundle.model.to(device)
        builtin = source.startswith("builtin:")
        if heads == "auto":
            heads = [p for p in ([builtin_heads_path(bundle.name), builtin_eagle_path(bundle.name)] if builtin
                                 else [bundle.path / "heads.safetensors", bundle.path / "eagle.safetensors"]) if p.is_file()]
        if draft == "auto":
            draft = _present(builtin_draft_path(bundle.name) if builtin else bundle.path / "draft.safetensors")
        pipe = cls(bundle, draft=None if draft is None else load_draft(draft, bundle.model))
        pipe.draft_source = None if draft is None else str(draft)
        files = [] if heads is None else [heads] if isinstance(heads, (str, os.PathLike)) else list(heads)
        if files:
            pipe.heads = merge_heads([load_heads(f, pipe.model) for f in files], [str(f) for f in files])
            pipe.heads_source = ", ".join(str(f) for f in files)
        if assistant is not None:
            helper = load_whisper(assistant, cache_dir)
            helper.model.to(device)
            pipe.assistant = new_assistant(helper, bundle)
        use_cuda_graphs(cuda_graphs, device, pipe.model, pipe.argmax_model, pipe._draft_model,
                        None if pipe.assistant is None else pipe.assistant.model)
        return pipe

    @staticmethod
    def methods() -> dict[str, MethodPlugin]:
        """The methods `transcribe` takes: name -> plug-in (parameters, exactness, needs)."""
        return ASR_REGISTRY

    def resources(self, method: Method | None = None) -> Resources:
        """What methods draw on; the target is the arg-max view unless `method` reads logit values."""
        target = self.model if method is None or method.exact_logits else self.argmax_model
        eagle = self._eagle_decoder()
        if eagle is not None and eagle.head.feature_layers and method is not None and "eagle" in method.needs:
            target = target.feature_view(eagle.head.feature_layers)     # the layer outputs the head fuses
        extras = {"medusa_block": self.heads.block, "eagle": eagle, "assistant": self.assistant}
        extras = {k: v for k, v in extras.items() if v is not None}
        return Resources(target, draft=self._draft_model, heads=self.heads.medusa, exit_heads=self.heads.exits,
                         extras=extras)

    def _eagle_decoder(self) -> EagleDecoder | None:
        head = self.heads.eagle
        if head is None:
            return None
        if self._eagle is None or self._eagle[0] is not head:
            self._eagle = head, EagleDecoder(head, self.model, quantized=self.model.device.type == "cpu")
        return self._eagle[1]

    def encoder(self, precision: str = "fp32") -> nn.Module:
        """The model's encoder at `precision` (fp32, bf16 or int8; see `encoder_precision`)."""
        if check_precision(precision) not in self._encoders:
            self._encoders[precision] = encoder_variant(self._encoders["fp32"], precision)
        return self._encoders[precision]

    # ---- transcription ------------------------------------------------------------------------

    def transcribe(self, audio: AudioLike | list, method: str | Method = "greedy", *, batch_size: int = 8,
                   language: str | None = "en", sample_rate: int | None = None, max_new_tokens: int = MAX_NEW_TOKENS,
                   progress: Callable[[int, int], None] | None = None, encoder: str = "fp32",
                   **method_params: Any) -> ASROutput:
        """Transcribe one input or a list (paths, arrays with `sample_rate`, `Audio`s).

        `encoder`: the encoder's precision, fp32 (the model as loaded), bf16 or int8; the cheaper
        ones change the encoder states and so may change the transcript (the decoder methods stay
        lossless against greedy on the same states).

        `method`: a name from `mmaccel.speech.methods.ASR_REGISTRY` or a Method; `method_params`
        configure it (k, depth, width, exit_layer, num_beams, ...). `progress(done, total)` is called
        after each batch with the 30-s windows transcribed so far and their total.
        """
        check(isinstance(batch_size, int) and batch_size >= 1, f"batch_size must be an int >= 1, got {batch_size!r}")
        check(isinstance(max_new_tokens, int) and 1 <= max_new_tokens <= MAX_NEW_TOKENS,
              f"max_new_tokens must be in [1, {MAX_NEW_TOKENS}], got {max_new_tokens!r}")
        spec = build_asr_method(method, **method_params)
        encoder_module = self.encoder(encoder)
        prompt = self.bundle.prompt(language)
        stats = DecodeStats()
        transcripts, windows = audio_windows(audio, sample_rate)
        parts: dict[int, dict[int, tuple[list[int], str]]] = {}
        resources = self.resources(spec)
        for start in range(0, len(windows), batch_size):
            batch = windows[start : start + batch_size]
            with stats.timed("features"):
                features = log_mel(self.bundle.feature_extractor, [w for _, _, w in batch])
            with stats.timed("encoder"):
                inputs = self.model.encode(features, prompt, [w.duration for _, _, w in batch], encoder_module)
            t0 = time.perf_counter()
            gen = spec.run(resources, inputs, max_new_tokens=max_new_tokens, sampling=Sampling(),
                           eos_token_id=self.bundle.tokens.end_of_text, prompt_tokens=[prompt] * len(batch))
            decode_s = time.perf_counter() - t0
            stats = stats + gen.stats
            stats.time_s["decode"] = stats.time_s.get("decode", 0.0) + decode_s
            for row, ((i, c, _), tokens) in enumerate(zip(batch, gen.tokens)):
                parts.setdefault(i, {})[c] = tokens, self.bundle.tokenizer.decode(tokens, skip_special_tokens=True).strip()
                # one pass per token for methods that do not say (beam, calm); a row also rides
                # along in its batch's passes after it ends, which this does not count
                transcripts[i].passes += len(tokens) if gen.commit_pass is None else len(set(gen.commit_pass[row]))
            if progress is not None:
                progress(min(start + batch_size, len(windows)), len(windows))
        join_windows(transcripts, parts)
        return ASROutput(transcripts, stats, spec.name)


def audio_windows(audio: AudioLike | list, sample_rate: int | None) -> tuple[list[Transcript], list[tuple]]:
    """One input or a list -> (a `Transcript` per input, its text still empty; the windows to decode as
    (input index, window index, Audio) of at most 30 s, longest first). Windows of similar length
    then share a batch, so rows finish close together. In a list, an input that cannot be read (or
    is silent) gets its error in its transcript and no window; a single input raises it."""
    many = isinstance(audio, list)
    items = audio if many else [audio]
    check(len(items) > 0, "no audio given: pass a file path, an array, or a non-empty list of them")
    transcripts, windows = [], []
    for i, item in enumerate(items):
        try:
            clip = as_audio(item, sample_rate)
            if is_silent(clip):
                raise InputError(f"{clip.source}: the audio is silent (RMS below 1e-4); nothing to transcribe")
        except InputError as err:
            if not many:
                raise
            transcripts.append(Transcript("", _name(item), 0.0, error=str(err)))
            continue
        transcripts.append(Transcript("", clip.source, clip.duration))
        windows += [(i, c, chunk) for c, chunk in enumerate(split_long(clip))]
    windows.sort(key=lambda w: -w[2].duration)
    return transcripts, windows


def join_windows(transcripts: list[Transcript], parts: dict[int, dict[int, tuple[list[int], str]]]) -> None:
    """Stitch each transcript from its windows' (tokens, text), `parts[input][window]`, in window order."""
    for i, chunks in parts.items():
        ordered = [chunks[c] for c in sorted(chunks)]
        transcripts[i].tokens = [t for tokens, _ in ordered for t in tokens]
        transcripts[i].text = " ".join(text for _, text in ordered if text)


def _present(path: Path) -> Path | None:
    return path if path.is_file() else None


def _name(item: Any) -> str:
    if isinstance(item, (str, os.PathLike)):
        return str(item)
    if isinstance(item, Audio):
        return item.source
    return "array"
