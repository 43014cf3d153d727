"""ASRPipeline: a Whisper model (+ trained draft heads) and any speech decoding method.

>>> asr = ASRPipeline.from_pretrained("builtin:base")
>>> out = asr.transcribe(["a.wav", "b.flac"], method="medusa")
>>> out.texts, out.stats.nfe, out.rtfx

Audio longer than 30 s is decoded in windows of 30 s (`mmaccel.speech.windows`): cut at quiet points
and batched with everything else; in timestamp mode one after another, each from where the last one's
transcript is complete; with VAD, its speech packed into windows. A list input reports a bad file in its transcript's
`error` and still transcribes the rest; a single bad input raises.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmaccel.core.adaptive import AdaptiveDrafting
from mmaccel.core.methods import Method, Resources
from mmaccel.core.model import on_host
from mmaccel.core.plugin import MethodPlugin
from mmaccel.core.sampling import Sampling
from mmaccel.core.stats import DecodeStats
from mmaccel.devices import resolve_device, use_cuda_graphs
from mmaccel.engine.compiled import Compiled, compile_module
from mmaccel.engine.compiled import available as compiled_available
from mmaccel.engine.compiled import runtime_version as compiled_runtime_version
from mmaccel.engine.machine import fast_bf16_matmul
from mmaccel.engine.measured import fastest, fingerprint
from mmaccel.engine.pass_costs import KV_LEN, WIDTHS, WidthCosts
from mmaccel.engine.precision import Precision, convert, resolve_precision
from mmaccel.errors import InputError, check
from mmaccel.paths import assets_dir
from mmaccel.speech.alignment import add_words
from mmaccel.speech.audio import SAMPLE_RATE, Audio, AudioLike, log_mel
from mmaccel.speech.cross_draft import Assistant, new_assistant
from mmaccel.speech.decoder import EncoderStates, WhisperDecoderModel
from mmaccel.speech.decoder_audio import EncodedAudio
from mmaccel.speech.draft import WhisperDraft, load_draft
from mmaccel.speech.eagle import EagleDecoder, EagleHead
from mmaccel.speech.fallback import TEMPERATURES, Fallback
from mmaccel.speech.heads import WhisperHeads, load_heads, merge_heads
from mmaccel.speech.language import language_probabilities
from mmaccel.speech.methods import ASR_REGISTRY, build_asr_method
from mmaccel.speech.pass_shape import whisper_width_costs
from mmaccel.speech.scoring import score_tokens
from mmaccel.speech.streaming import Streamer, StreamUpdate, stream_updates
from mmaccel.speech.timestamps import TimestampRules
from mmaccel.speech.transcript import Transcript, WindowResult, join_windows, window_result
from mmaccel.speech.vad import VadParameters
from mmaccel.speech.whisper import WhisperBundle, load_whisper
from mmaccel.speech.windows import Window, audio_windows, next_window, windows_left

MAX_NEW_TOKENS = 224   # per 30-s window, as openai-whisper (half the decoder's 448 positions)
PROMPT_SLACK = 72      # decoder positions an initial prompt leaves free beside max_new_tokens: the prompt proper, drafts


def builtin_heads_path(name: str) -> Path:
    """Where the shipped heads file of builtin Whisper `name` ("base", "tiny.en") lies; it may not exist."""
    return assets_dir() / f"whisper_{name}_heads.safetensors"


def builtin_eagle_path(name: str) -> Path:
    """Where the shipped EAGLE head of builtin Whisper `name` lies; it may not exist."""
    return assets_dir() / f"whisper_{name}_eagle.safetensors"


def heads_option(value: str) -> str | list[str] | None:
    """A command line's heads value ("auto", "none" or comma-separated files) as `from_pretrained` takes it."""
    return None if value == "none" else "auto" if value == "auto" else value.split(",")


def draft_option(value: str) -> str | None:
    """A command line's draft value ("auto", "none" or a file) as `from_pretrained` takes it."""
    return None if value == "none" else value


def builtin_draft_path(name: str) -> Path:
    """Where the shipped draft decoder of builtin Whisper `name` lies; it may not exist."""
    return assets_dir() / f"whisper_{name}_draft.safetensors"


@dataclass
class ASROutput:
    """What `ASRPipeline.transcribe` returns: one transcript per input, in input order (a list input's bad file
    has its `error` set and an empty text), the decode statistics and the name of the method that decoded."""

    transcripts: list[Transcript]
    stats: DecodeStats              # decoder counters; time_s also holds "features" and "encoder"
    method: str

    @property
    def texts(self) -> list[str]:
        """Each transcript's text, in input order."""
        return [t.text for t in self.transcripts]

    @property
    def audio_s(self) -> float:
        """Seconds of audio transcribed: the inputs' durations, leaving out those that failed."""
        return sum(t.duration for t in self.transcripts if t.error is None)

    @property
    def wall_s(self) -> float:
        """The whole `transcribe` call on audio in memory (VAD, features, language detection, encoder, decoding,
        the fallback's re-decodes, scores, word alignment): the Open ASR Leaderboard's transcription time."""
        return self.stats.time_s["transcribe"]

    @property
    def rtfx(self) -> float:
        """Inverse real-time factor: `audio_s / wall_s`, seconds of audio per second of `transcribe`; 0 when
        `wall_s` is 0."""
        return self.audio_s / self.wall_s if self.wall_s > 0 else 0.0


class ASRPipeline:
    """A Whisper model with its optional draft heads (Medusa, early exit, Medusa-Block, EAGLE), draft decoder and
    assistant Whisper; `transcribe` decodes with any method of `mmaccel.speech.methods.ASR_REGISTRY`."""

    def __init__(self, bundle: WhisperBundle, heads: WhisperHeads | None = None, draft: WhisperDraft | None = None,
                 precision: str = "fp32"):
        check(isinstance(bundle, WhisperBundle), f"bundle must be a WhisperBundle, got {type(bundle).__name__}")
        self.bundle = bundle
        device = bundle.model.device
        # the precisions the model runs in (`mmaccel.engine.precision`), each part's by what bounds it: the
        # encoder window is compute-bound, the decoder's one-token passes read every weight. The decoder is
        # int8 (linear layers and vocabulary projection) or fp32: a bf16 decoder is not built, since its
        # one-token products measured slower than fp32's here (benchmarks/floor/floor.json), only its arg-max
        # readout below
        self.precision = precision                                      # as asked
        self._encoder_precision = resolve_precision(precision, device, compiled=compiled_available())
        self._auto_encoder: Precision | None = None      # what "auto" runs the encoder in (`auto_encoder_precision`)
        self.decoder_precision = resolve_precision(precision, device, bound="bandwidth")
        # an int8 decoder on the host runs its attention in one kernel shape: with its exact integer products, a
        # token's logits are then bitwise the same in every pass, and greedy-verified methods give greedy's tokens
        # by construction (`mmaccel.engine.attention`; int8 amplifies the ~1e-7 by which attention otherwise rounds
        # a verify pass). fp32's products round by the call's shape themselves: its identity is measured, not built
        int8 = self.decoder_precision.name == "int8"
        self.model = WhisperDecoderModel(bundle.model, quantized=int8, fixed_shape=int8 and on_host(device))
        if int8 and on_host(device) and compiled_available():
            # the whole pass as one OpenVINO graph that keeps the cache (`decoder_graph`), built at the first decode
            self.model.compile_graph(lazily=True)
        # greedy decoding and greedy-verified methods read only arg-maxes: a bf16-first projection
        # whose arg-max is the fp32 one (`ArgmaxProjection`), on a CPU with native bf16 products (its
        # short list of candidates has a data-dependent size: on a GPU that would make every step wait
        # for the host, which costs more than the fp32 projection it saves)
        fp32_readout = not self.model.quantized and on_host(device) and fast_bf16_matmul(device)
        self.argmax_model = self.model.argmax_view() if fp32_readout else self.model
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
        # the log-mel of a window after a clip shorter than 30 s (`audio.log_mel`): "zeros" as openai-whisper's
        # transcribe and faster-whisper; "silence" as transformers' feature extractor alone
        self.mel_padding = "zeros"
        # the pass costs adaptive drafting measured, kept for the pipeline's lifetime (with and without timestamps),
        # read against the engine's measurement of the target's pass by width at each batch size
        self._adaptive = {t: AdaptiveDrafting(prior=lambda rows, t=t: self.pass_costs(rows, t)) for t in (False, True)}

    @classmethod
    def from_pretrained(cls, source: str = "builtin:base", *, heads: str | os.PathLike | list | None = "auto",
                        draft: str | os.PathLike | None = "auto", assistant: str | None = None,
                        cache_dir: str | os.PathLike | None = None, device: str | torch.device | None = None,
                        cuda_graphs: bool = False, precision: str = "fp32") -> ASRPipeline:
        """`source`: "builtin:base", "builtin:tiny.en" or a local Hugging Face Whisper directory.

        `heads`: a heads file (Medusa, exit, Medusa-Block and/or EAGLE heads) or a list of them, each
        kind from one file; `draft`: a draft decoder file (for `speculative` / `tree`). "auto" loads
        the shipped files of a builtin model (heads, EAGLE head, draft decoder; or `heads.safetensors`,
        `eagle.safetensors`, `draft.safetensors` inside a local directory) when present; None loads none.
        `assistant`: another Whisper (a source like "builtin:tiny.en") for `speculative-cross`.
        `device`: cpu (default), cuda, cuda:N or auto; heads and drafts follow the model.
        `cuda_graphs`: replay the decoders' fixed-shape steps as CUDA graphs (a GPU only).
        `precision`: fp32 (the model as loaded, the default), bf16 (the encoder, compiled by OpenVINO on a CPU;
        native bf16 only), int8 (encoder and decoder linear layers, a scale per weight row and per token) or auto
        (each part as this CPU runs it fastest: the encoder compiled in int8 where the CPU has int8 dot-product
        units, or in bf16 where that measured faster here (`auto_encoder_precision`), else bf16 where native, else
        fp32; the decoder in int8; `pipe.precision_reason` says which). Not lossless against fp32: the transcript
        may move. At int8 the greedy-verified methods give int8 greedy's tokens: on the host with OpenVINO the
        decoder's passes run as one compiled graph at one shape (`decoder_graph`), else eagerly with exact int8
        products and attention in one kernel shape.
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
        pipe = cls(bundle, draft=None if draft is None else load_draft(draft, bundle.model), precision=precision)
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

    def resources(self, method: Method | None = None, logit_values: bool = False) -> Resources:
        """What methods draw on; the target is the arg-max view unless `method` reads logit values or the
        decoding does (`logit_values`: sampling, or the timestamp rules, which compare the timestamps' total
        probability with the text's)."""
        target = self.model if method is None or method.exact_logits or logit_values else self.argmax_model
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

    def pass_costs(self, rows: int = 1, timestamps: bool = False) -> WidthCosts | None:
        """The target's pass by width at batch `rows`, as greedy-verified decoding runs it (with `timestamps`: the
        full logits and the timestamp rules), on the host (adaptive drafting runs there only); None elsewhere, and
        for a model too short for the widest pass timed."""
        if not on_host(self.model.device) or self.bundle.model.config.max_target_positions < KV_LEN + max(WIDTHS) + 8:
            return None
        target = self.model if timestamps else self.argmax_model
        prompt = self.bundle.prompt("en", "transcribe", timestamps)
        tokens = self.bundle.tokens
        rules = TimestampRules(tokens.no_timestamps, tokens.end_of_text, len(prompt)) if timestamps else None
        return whisper_width_costs(target, prompt, rows, rules)

    @property
    def encoder_precision(self) -> Precision:
        """The precision the encoder runs in (`precision` as resolved; "auto": `auto_encoder_precision`)."""
        return self.auto_encoder_precision if self._encoder_precision.requested == "auto" else self._encoder_precision

    @property
    def auto_encoder_precision(self) -> Precision:
        """What "auto" runs the encoder in: on a CPU that runs both compiled int8 and native bf16, the one whose
        window measured faster here (decided on first use); else the engine's rule (`resolve_precision`)."""
        if self._auto_encoder is None:
            device = self.model.device
            auto = resolve_precision("auto", device, compiled=compiled_available())
            both = auto.name == "int8" and on_host(device) and fast_bf16_matmul(device)
            self._auto_encoder = self._fastest_encoder() if both else auto
        return self._auto_encoder

    def _fastest_encoder(self) -> Precision:
        """int8 or bf16, compiled, whichever encodes a window faster on this machine (`mmaccel.engine.measured`:
        timed once per machine and model, then read from disk; the slower one is not kept). The two differ by
        model: on a Zen 4 EPYC Whisper base's int8 window took 0.22 s against bf16's 0.25 s, while tiny.en transcribed
        faster with the bf16 one."""
        fp32 = self._encoders["fp32"]
        features = torch.zeros(1, fp32.config.num_mel_bins, 2 * fp32.config.max_source_positions)
        prompt = self.bundle.prompt("en")

        def candidate(name: str):
            def build():
                if name not in self._encoders:
                    self._encoders[name] = self._built_encoder(name)
                encoder = self._encoders[name]
                return lambda: self.model.encode(features, prompt, encoder=encoder)
            return build
        name, ms, source = fastest("encoder_choice", {"part": "whisper-encoder", "model": fingerprint(fp32),
                                                      "openvino": compiled_runtime_version()},
                                   {p: candidate(p) for p in ("int8", "bf16")})
        for other in ("int8", "bf16"):
            if other != name:
                self._encoders.pop(other, None)
        timed = ", ".join(f"{p} {t / 1e3:.2f} s" for p, t in sorted(ms.items()))
        return Precision(name, "auto", f"auto: {name}, compiled (the faster window here: {timed}; {source})")

    @property
    def precision_reason(self) -> str:
        """Which precision each part runs in and why, one line."""
        return f"encoder {self.encoder_precision.reason}; decoder {self.decoder_precision.reason}"

    def encoder(self, precision: str | None = None) -> nn.Module | Compiled:
        """The model's encoder at `precision` (fp32, bf16 or int8; "auto": what this machine runs natively; None:
        the pipeline's), built once (`mmaccel.engine`): bf16 on a CPU is the encoder compiled by OpenVINO
        (`mmaccel.engine.compiled`, cached on disk; torch's eager bf16 where it cannot be), int8 too (int8 weights
        with a scale per row, activations quantised per token as it runs; else a copy with `Int8Linear` layers). Not
        lossless: its states, and so the transcript, move; the ASR benchmark reports each precision's WER beside its
        speed."""
        precision = (self.encoder_precision if precision is None else self.auto_encoder_precision if precision == "auto"
                     else resolve_precision(precision, self.model.device, compiled=compiled_available())).name
        if precision not in self._encoders:
            self._encoders[precision] = self._built_encoder(precision)
        return self._encoders[precision]

    def _built_encoder(self, precision: str) -> nn.Module | Compiled:
        fp32 = self._encoders["fp32"]
        if precision in ("bf16", "int8") and on_host(self.model.device):
            frames = 2 * fp32.config.max_source_positions               # 3000 mel frames: a 30-s window
            compiled = compile_module(EncoderStates(fp32), (torch.zeros(1, fp32.config.num_mel_bins, frames),),
                                      precision)
            if compiled is not None:
                return compiled
        return convert(fp32, precision)

    def alignment_heads(self) -> list[tuple[int, int]]:
        """The (decoder layer, head) pairs whose cross-attention follows the audio (word timestamps)."""
        heads = getattr(self.bundle.model.generation_config, "alignment_heads", None)
        if not heads:
            raise InputError(f"Whisper {self.bundle.name} has no alignment heads (generation_config.alignment_heads "
                             "in its directory); word timestamps need them")
        return [(int(layer), int(head)) for layer, head in heads]

    # ---- transcription ------------------------------------------------------------------------

    def transcribe(self, audio: AudioLike | list, method: str | Method = "greedy", *, batch_size: int = 8,
                   language: str | None = "en", task: str = "transcribe", sample_rate: int | None = None,
                   max_new_tokens: int = MAX_NEW_TOKENS, progress: Callable[[int, int], None] | None = None,
                   encoder: str | None = None, timestamps: bool = False, word_timestamps: bool = False,
                   vad_filter: bool = False, vad_parameters: VadParameters | dict | None = None,
                   temperature: float | Sequence[float] = TEMPERATURES, compression_ratio_threshold: float | None = 2.4,
                   log_prob_threshold: float | None = -1.0, no_speech_threshold: float | None = 0.6,
                   best_of: int = 5, seed: int = 0, adaptive: bool = True, initial_prompt: str | None = None,
                   **method_params: Any) -> ASROutput:
        """Transcribe one input or a list (paths, arrays with `sample_rate`, `Audio`s).

        `language`: a language code, or None to detect each input's from its first 30 s (on an
        English-only model, None is English); `task`: "transcribe" or "translate" (to English, on a
        multilingual model).

        `encoder`: the encoder's precision, fp32 (the model as loaded), bf16, int8 or auto (default: the
        pipeline's `precision`); the cheaper ones change the encoder states and so may change the transcript
        (the decoder methods stay lossless against greedy on the same states).

        `timestamps`: decode in Whisper's timestamp mode (its rules apply to every method, so the
        lossless ones still give greedy's tokens): each transcript's `segments` carry their times and
        the window's average log-probability, compression ratio and no-speech probability. Without
        it each 30-s window is one segment. `word_timestamps` (timestamp mode implied): each segment's
        `words` with their times and probabilities, aligned by the model's alignment heads.

        `vad_filter`: decode only the speech Silero VAD finds (`vad_parameters`: a dict of
        `mmaccel.speech.vad.VadParameters`), packed into 30-s windows (in timestamp mode joined and
        decoded window after window, as long audio is); times stay the input's. Long silences and noise
        then never reach the decoder, and an input without speech gets an empty transcript rather than
        an error.

        `temperature` and the thresholds: Whisper's temperature fallback (`mmaccel.speech.fallback`), on by
        default with openai-whisper's and faster-whisper's defaults: a window whose text repeats itself
        (compression ratio above `compression_ratio_threshold`) or that the model doubts (mean log-probability
        below `log_prob_threshold`) is decoded again at the next temperature, `best_of` samples seeded by
        `seed`; a doubtful window whose <|nospeech|> probability is above `no_speech_threshold` is left
        empty. The method decodes at the first temperature; `temperature=0` turns the fallback off.

        `initial_prompt`: text that conditions every window's decoding (spellings, names, style), given to the
        decoder as Whisper's previous text (<|startofprev|> and its last tokens) before the prompt, as
        openai-whisper and faster-whisper's batched pipeline do; it is not part of the transcript.

        `method`: a name from `mmaccel.speech.methods.ASR_REGISTRY` or a Method; `method_params`
        configure it (k, depth, width, exit_layer, num_beams, ...). With `adaptive` (on a CPU) a draft
        method drafts at most its k per pass, fewer or none where its drafts are rarely accepted or a
        verify pass costs too much at this batch size (`mmaccel.core.adaptive`); the tokens stay the same.
        `progress(done, total)` is called after each batch with the 30-s windows transcribed so far and
        their total.
        """
        check(isinstance(batch_size, int) and batch_size >= 1, f"batch_size must be an int >= 1, got {batch_size!r}")
        check(isinstance(vad_filter, bool), f"vad_filter must be True or False, got {vad_filter!r}")
        vad = VadParameters.of(vad_parameters) if vad_filter else None
        fallback = Fallback.of(temperature, compression_ratio_threshold, log_prob_threshold, no_speech_threshold,
                               best_of, seed)
        job = self._job(method, method_params, language=language, task=task, max_new_tokens=max_new_tokens,
                        encoder=encoder, timestamps=timestamps, word_timestamps=word_timestamps, fallback=fallback,
                        adaptive=adaptive, initial_prompt=initial_prompt)
        timestamps = job.rules is not None
        tokens = self.bundle.tokens
        started = time.perf_counter()
        stats = DecodeStats()
        transcripts, windows = audio_windows(audio, sample_rate, vad, follow=timestamps)
        if language is None and tokens.multilingual:
            with stats.timed("language"):
                self._detect_languages(transcripts, windows, job, batch_size)
        for t in transcripts:
            t.language = None if t.error is not None else t.language or language or "en"
        parts: dict[int, dict[int, WindowResult]] = {}
        tried: dict[tuple[int, int], list[WindowResult]] = {}     # a window's decodes so far, one per temperature
        done = 0
        while windows:
            batch, windows = _next_batch(windows, batch_size, fallback)
            stats = stats + self._transcribe_batch(job, batch, [transcripts[w.input] for w in batch], tried)
            finished = []
            for w in batch:
                if fallback.retry(tried[w.input, w.index][-1], w.attempt):
                    windows.append(dataclasses.replace(w, attempt=w.attempt + 1))
                else:
                    parts.setdefault(w.input, {})[w.index] = fallback.final(tried.pop((w.input, w.index)))
                    job.states.pop((w.input, w.index), None)
                    finished.append(w)
            following = [next_window(w, parts[w.input][w.index].complete) for w in finished if w.clip is not None]
            windows = sorted(windows + [w for w in following if w is not None], key=lambda w: (w.attempt, -w.duration))
            done += len(finished)
            if progress is not None:
                progress(done, done + windows_left(windows))
        join_windows(transcripts, parts)
        stats.time_s["transcribe"] = time.perf_counter() - started
        return ASROutput(transcripts, stats, job.spec.name)

    def stream(self, chunks: Iterable, method: str | Method = "greedy", *, sample_rate: int = SAMPLE_RATE,
               language: str = "en", min_chunk_s: float = 1.0, trim_s: float = 15.0, encoder: str | None = None,
               **method_params: Any) -> Iterator[StreamUpdate]:
        """Transcribe live audio: `chunks` (mono sample arrays at `sample_rate`, e.g. read from a microphone
        or `mmaccel.speech.streaming.realtime_chunks`) -> an update each time a decode commits words (local
        agreement of consecutive hypotheses: `mmaccel.speech.streaming`), the final one when `chunks` ends.
        Committed words are never retracted and carry their emission delay. `method` and `method_params`
        as for `transcribe`."""
        check(language is not None, "a stream needs its language (detection reads a whole window first)")
        spec = build_asr_method(method, **method_params)
        self.bundle.prompt(language, "transcribe", True)                # checks the language here, not mid-stream

        def transcribe(audio: Audio) -> ASROutput:
            return self.transcribe(audio, spec, batch_size=1, language=language, encoder=encoder, word_timestamps=True)

        return stream_updates(Streamer(transcribe, sample_rate=sample_rate, min_chunk_s=min_chunk_s, trim_s=trim_s),
                              chunks)

    def _transcribe_batch(self, job: _Job, batch: list[Window], owners: list[Transcript],
                          tried: dict[tuple[int, int], list[WindowResult]]) -> DecodeStats:
        """Decode one batch of windows (each row with its input's language), all at one temperature of the
        fallback, and add each window's result to `tried`; its statistics. A sampled temperature decodes
        `best_of` rows per window from the encoder states of its first decode, and keeps the likeliest."""
        stats = DecodeStats()
        attempt = batch[0].attempt
        temperature, n = job.fallback.temperatures[attempt], job.fallback.samples(attempt)
        prompts = [self.bundle.prompt(t.language, job.task, job.rules is not None, job.previous) for t in owners]
        if attempt == 0:
            inputs = self._encode(job, batch, prompts, stats)
            if len(job.fallback.temperatures) > 1:      # kept for the re-decodes
                for row, w in enumerate(batch):
                    job.states[w.input, w.index] = inputs.select_rows(torch.tensor([row]), self.model.device)
        else:
            inputs = EncodedAudio.concat([job.states[w.input, w.index] for w in batch])
        if n > 1:
            inputs = inputs.repeat(n)
            prompts = [p for p in prompts for _ in range(n)]
        method, resources = (job.spec, job.resources) if attempt == 0 else (job.sampler, Resources(self.model))
        t0 = time.perf_counter()
        eot = self.bundle.tokens.end_of_text
        gen = method.run(resources, inputs, max_new_tokens=job.max_new_tokens, sampling=Sampling(temperature),
                         seed=job.fallback.seed + attempt, eos_token_id=eot, prompt_tokens=prompts,
                         adaptive=job.adaptive if attempt == 0 else None)
        stats = stats + gen.stats
        phase = "decode" if attempt == 0 else "fallback"
        stats.time_s[phase] = stats.time_s.get(phase, 0.0) + time.perf_counter() - t0
        scores = None
        if job.rules is not None or job.fallback.scored:
            with stats.timed("scores"):
                scores = score_tokens(self.model, inputs, gen.tokens, self.bundle.tokens.no_speech, len(job.previous))
        for i, (window, owner) in enumerate(zip(batch, owners)):
            rows = range(i * n, (i + 1) * n)
            samples = {row: window_result(self.bundle.tokenizer, gen.tokens[row], window, job.rules,
                                          None if scores is None else scores[row], temperature) for row in rows}
            row = max(rows, key=lambda r: samples[r].avg_logprob)      # the likeliest sample
            part = samples[row]
            if job.heads is not None:
                with stats.timed("words"):
                    self._add_words(job, inputs, row, part, owner)
            tried.setdefault((window.input, window.index), []).append(part)
            # one pass per token for methods that do not say (beam, calm); a row also rides
            # along in its batch's passes after it ends, which this does not count
            owner.passes += max(len(gen.tokens[r]) if gen.commit_pass is None else len(set(gen.commit_pass[r]))
                                for r in rows)
        return stats

    def _add_words(self, job: _Job, inputs: EncodedAudio, row: int, part: WindowResult, owner: Transcript) -> None:
        """`part`'s words (decoded as row `row` of `inputs`), aligned by the model's alignment heads."""
        add_words(self.model, inputs, row, part, self.bundle.prompt(owner.language, job.task), job.heads,
                  self.bundle.tokenizer, self.bundle.tokens.end_of_text, owner.language)

    def _job(self, method: str | Method, method_params: dict[str, Any], *, language: str | None, task: str,
             max_new_tokens: int, encoder: str | None, timestamps: bool, word_timestamps: bool, fallback: Fallback,
             adaptive: bool, initial_prompt: str | None) -> _Job:
        """What every decode of one `transcribe` call (or one joined call) decodes with; checks the options."""
        check(isinstance(max_new_tokens, int) and 1 <= max_new_tokens <= MAX_NEW_TOKENS,
              f"max_new_tokens must be in [1, {MAX_NEW_TOKENS}], got {max_new_tokens!r}")
        check(isinstance(timestamps, bool), f"timestamps must be True or False, got {timestamps!r}")
        check(isinstance(word_timestamps, bool), f"word_timestamps must be True or False, got {word_timestamps!r}")
        check(isinstance(adaptive, bool), f"adaptive must be True or False, got {adaptive!r}")
        timestamps = timestamps or word_timestamps
        spec = build_asr_method(method, **method_params)
        previous = self._previous_text(initial_prompt, max_new_tokens)
        prompt = self.bundle.prompt(language or "en", task, timestamps, previous)       # checks language and task
        tokens = self.bundle.tokens
        return _Job(spec, self.resources(spec, timestamps or fallback.temperatures[0] > 0), self.encoder(encoder),
                    max_new_tokens, task, previous,
                    TimestampRules(tokens.no_timestamps, tokens.end_of_text, len(prompt)) if timestamps else None,
                    self.alignment_heads() if word_timestamps else None,
                    self._adaptive[timestamps] if adaptive else None, fallback)

    def _previous_text(self, text: str | None, max_new_tokens: int) -> list[int]:
        """<|startofprev|> and the last tokens of `text` that leave the decoder room for `max_new_tokens` and
        drafts (openai-whisper keeps up to 223); nothing for no text."""
        check(text is None or isinstance(text, str), f"initial_prompt must be text, got {type(text).__name__}")
        if text is None or not text.strip():
            return []
        start = self.bundle.tokens.start_of_prev
        check(start is not None, "this Whisper's tokenizer has no <|startofprev|>: it cannot take an initial_prompt")
        room = self.model.max_positions - max_new_tokens - PROMPT_SLACK
        ids = self.bundle.tokenizer.encode(" " + text.strip(), add_special_tokens=False)
        return [start, *ids[-min(room, self.model.max_positions // 2 - 1):]]

    def _encode(self, job: _Job, batch: list[Window], prompts: list[list[int]], stats: DecodeStats) -> EncodedAudio:
        """The encoder states of `batch`'s windows under `prompts`; those language detection kept (`job.states`)
        are not encoded again."""
        fresh = [(w, p) for w, p in zip(batch, prompts) if (w.input, w.index) not in job.states]
        if fresh:
            with stats.timed("features"):
                features = log_mel(self.bundle.feature_extractor, [w.audio for w, _ in fresh], self.mel_padding)
            with stats.timed("encoder"):
                encoded = self.model.encode(features, [p for _, p in fresh], [w.duration for w, _ in fresh],
                                            job.encoder, job.rules)
            if len(fresh) == len(batch):
                return encoded
            for row, (w, _) in enumerate(fresh):
                job.states[w.input, w.index] = encoded.select_rows(torch.tensor([row]), self.model.device)
        inputs = EncodedAudio.concat([job.states[w.input, w.index] for w in batch])
        inputs.prompt = torch.tensor(prompts, dtype=torch.long)
        return inputs

    def _detect_languages(self, transcripts: list[Transcript], windows: list[Window], job: _Job,
                          batch_size: int) -> None:
        """Each input's language (and its probability) from its first window. The encoder states of the first
        `batch_size` such windows are kept for their decode (`_encode`), which so runs the encoder once."""
        firsts = [w for w in windows if w.index == 0]
        start = [self.bundle.tokens.start_of_transcript]
        for at in range(0, len(firsts), batch_size):
            batch = firsts[at : at + batch_size]
            features = log_mel(self.bundle.feature_extractor, [w.audio for w in batch], self.mel_padding)
            encoded = self.model.encode(features, start, [w.duration for w in batch], job.encoder, job.rules)
            detected = language_probabilities(self.model, encoded, self.bundle.tokens)
            encoded.cross_kv.clear()                # the decode computes its own (`EncodedAudio.concat`)
            for row, (w, probs) in enumerate(zip(batch, detected)):
                code, p = next(iter(probs.items()))
                transcripts[w.input].language, transcripts[w.input].language_probability = code, p
                if at == 0:
                    job.states[w.input, w.index] = encoded.select_rows(torch.tensor([row]), self.model.device)


@dataclass
class _Job:
    """What every batch of one `transcribe` call decodes with."""

    spec: Method
    resources: Resources
    encoder: nn.Module
    max_new_tokens: int
    task: str
    previous: list[int]                     # <|startofprev|> and the initial prompt's tokens, or nothing
    rules: TimestampRules | None            # timestamp mode
    heads: list[tuple[int, int]] | None     # alignment heads, for word timestamps
    adaptive: AdaptiveDrafting | None       # the pass costs of adaptive drafting; None: every pass drafts k
    fallback: Fallback
    sampler: Method = dataclasses.field(default_factory=lambda: build_asr_method("greedy"))   # the fallback's re-decodes
    # each window's encoder output (one row), kept until its result is final when the fallback may decode it again
    states: dict[tuple[int, int], EncodedAudio] = dataclasses.field(default_factory=dict)


def _next_batch(windows: list[Window], batch_size: int, fallback: Fallback) -> tuple[list[Window], list[Window]]:
    """The next batch of `windows` (in order) and the rest: up to `batch_size` windows at one temperature (a
    sampled one decodes `best_of` rows per window: on a CPU a step over 5x the rows costs far less than 5 steps)."""
    attempt = windows[0].attempt
    batch = [w for w in windows if w.attempt == attempt][:batch_size]
    taken = {id(w) for w in batch}
    return batch, [w for w in windows if id(w) not in taken]


def _present(path: Path) -> Path | None:
    return path if path.is_file() else None
