"""`/v1/audio/transcriptions` and `/v1/audio/translations`: the OpenAI request and response shapes over
`ASRPipeline.transcribe`, with our `method`, `method_params` (a JSON object), `encoder` (fp32 | bf16 | int8: the
encoder's precision, by default the server's `--precision`; bf16 and int8 are cheaper and not lossless) and
`vad_filter` fields.

Requests with the same options (model, method and parameters, encoder, language, task, timestamp mode, temperature,
prompt, VAD) are decoded together by the model's worker (`mmaccel.serve.batching`); each request's audio is read and
checked before it queues, so one bad upload never fails another's call.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.datastructures import UploadFile

from mmaccel.engine.precision import PRECISIONS
from mmaccel.errors import InputError, check
from mmaccel.serve.batching import Call, Job, Joining, ModelWorker, call_rows, most_waiting
from mmaccel.serve.fields import params_of, parse_params
from mmaccel.speech.audio import WINDOW_S, Audio, load_audio
from mmaccel.speech.transcript import Transcript
from mmaccel.speech.writers import as_srt, as_vtt

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("segment", "word")
FIELDS = {"transcribe": {"file", "model", "language", "prompt", "response_format", "temperature",
                         "timestamp_granularities[]", "method", "method_params", "encoder", "vad_filter"},
          "translate": {"file", "model", "prompt", "response_format", "temperature", "method", "method_params",
                        "encoder", "vad_filter"}}


class TooLarge(InputError):
    """An upload over the size limit (413)."""


@dataclass(frozen=True)
class Options:
    """What a transcription call is decoded with: requests with equal options share a call."""

    method: str
    params: tuple[tuple[str, Any], ...]
    language: str | None
    task: str
    timestamps: bool
    word_timestamps: bool
    temperature: float | tuple[float, ...]
    vad_filter: bool
    prompt: str | None = None       # Whisper's initial prompt: text that conditions every window
    encoder: str | None = None      # the encoder's precision (mmaccel.engine.precision); None: the server's


@dataclass
class TranscriptionRequest:
    """A transcription or translation request as `parse_request` reads it: the model it names, the options it is
    decoded with, its response format and the timestamp granularities asked for (verbose_json only)."""

    model: str
    options: Options
    response_format: str
    granularities: tuple[str, ...]


def _one(form, name: str) -> str | None:
    values = form.getlist(name)
    check(len(values) <= 1, f"{name} is given {len(values)} times")
    if not values:
        return None
    check(isinstance(values[0], str), f"{name} must be a form field, not a file")
    return values[0]


def _flag(value: str | None, name: str) -> bool:
    if value is None:
        return False
    check(value.lower() in ("true", "false", "1", "0"), f"{name} must be true or false, got {value!r}")
    return value.lower() in ("true", "1")


def parse_request(form, task: str, default_method: str, max_bytes: int) -> tuple[TranscriptionRequest, UploadFile]:
    """The request of a multipart form (its upload still to be read); InputError with one line for anything off."""
    unknown = sorted(set(form.keys()) - FIELDS[task])
    check(not unknown, f"unknown field(s) {', '.join(unknown)}; this endpoint takes {', '.join(sorted(FIELDS[task]))}")
    uploads = form.getlist("file")
    check(len(uploads) == 1 and isinstance(uploads[0], UploadFile), "the request needs one audio upload in field 'file'")
    upload = uploads[0]
    model = _one(form, "model")
    check(model, "the request needs a 'model' (GET /v1/models lists them)")
    response_format = _one(form, "response_format") or "json"
    check(response_format in FORMATS, f"response_format must be one of {', '.join(FORMATS)}, got {response_format!r}")
    granularities = tuple(form.getlist("timestamp_granularities[]"))
    check(all(g in GRANULARITIES for g in granularities),
          f"timestamp_granularities[] takes {' and '.join(GRANULARITIES)}, got {', '.join(map(str, granularities))}")
    check(not granularities or response_format == "verbose_json",
          "timestamp_granularities[] needs response_format=verbose_json")
    temperature_field = _one(form, "temperature")
    try:
        temperature = 0.0 if temperature_field in (None, "") else float(temperature_field)
    except ValueError:
        raise InputError(f"temperature must be a number, got {temperature_field!r}") from None
    check(0.0 <= temperature <= 1.0, f"temperature must be in [0, 1], got {temperature}")
    params = parse_params(_one(form, "method_params"))
    language = _one(form, "language") or None
    encoder = _one(form, "encoder") or None          # None: the encoder the server runs (`--precision`)
    check(encoder is None or encoder in PRECISIONS, f"encoder must be one of {', '.join(PRECISIONS)}, got {encoder!r}")
    words = "word" in granularities
    timestamps = response_format in ("srt", "vtt", "verbose_json")
    # temperature 0 is OpenAI's "raise the temperature when the thresholds fail": the fallback's defaults
    options = Options(_one(form, "method") or default_method, params_of(params), language, task,
                      timestamps, words, _fallback() if temperature == 0.0 else temperature,
                      _flag(_one(form, "vad_filter"), "vad_filter"), _one(form, "prompt") or None, encoder)
    if upload.size is not None and upload.size > max_bytes:        # sent without a Content-Length the app could read
        raise TooLarge(f"the upload is {upload.size} bytes; uploads are limited to {max_bytes / 2**20:g} MiB")
    return TranscriptionRequest(model, options, response_format, granularities), upload


def check_options(asr, options: Options) -> None:
    """Fail now, in one line, on what would fail the call this request shares: method, parameters (and what the
    method needs of the model), language, task."""
    from mmaccel.speech.methods import build_asr_method

    build_asr_method(options.method, **dict(options.params)).check_needs(asr.resources())
    asr.bundle.prompt(options.language or "en", options.task, options.timestamps)


def _fallback() -> tuple[float, ...]:
    from mmaccel.speech.fallback import TEMPERATURES

    return tuple(TEMPERATURES)


def read_upload(upload: UploadFile) -> Audio:
    """The upload's audio (16 kHz mono); InputError naming the upload when it is not audio. Runs in a thread."""
    name = Path(upload.filename or "upload").name
    suffix = Path(name).suffix if len(Path(name).suffix) <= 8 else ""
    upload.file.seek(0)
    with tempfile.NamedTemporaryFile(suffix=suffix, delete=False) as tmp:
        while block := upload.file.read(1 << 20):
            tmp.write(block)
    try:
        audio = load_audio(tmp.name)
    except InputError as err:
        raise InputError(str(err).replace(tmp.name, name)) from None
    finally:
        os.unlink(tmp.name)
    return Audio(audio.samples, name)


def speech_worker(name: str, asr, *, max_rows: int, max_queue: int, on_call, continuous: bool = True) -> ModelWorker:
    """The worker that decodes one Whisper model's requests with equal `Options` together: in a call whose rows
    take waiting requests' windows as they end where the method can (`continuous`; greedy first: the fallback's
    temperature 0), else a call per batch of requests."""

    def run(options: Options, audios: list[Audio]) -> list[Transcript]:
        out = asr.transcribe(audios, options.method, batch_size=max_rows, language=options.language,
                             task=options.task, timestamps=options.timestamps,
                             word_timestamps=options.word_timestamps, vad_filter=options.vad_filter,
                             temperature=options.temperature, initial_prompt=options.prompt,
                             encoder=options.encoder, **dict(options.params))
        return out.transcripts

    def joins(options: Options) -> bool:
        from mmaccel.speech.methods import build_asr_method

        first = options.temperature[0] if isinstance(options.temperature, tuple) else options.temperature
        method = build_asr_method(options.method, **dict(options.params))
        return first == 0.0 and method.joins(asr.resources(method, True))

    def run_joining(options: Options, joining: Joining) -> None:
        from mmaccel.speech.joined import JoinedTranscription

        rows = call_rows(sum(job.rows for job in joining.jobs), max_rows, joining.busy)
        JoinedTranscription(asr, _Requests(joining, most_waiting(rows, max_rows)), [(job, job.payload) for job in joining.jobs],
                            rows=rows, method=options.method, language=options.language, task=options.task,
                            timestamps=options.timestamps, word_timestamps=options.word_timestamps,
                            vad_filter=options.vad_filter, temperature=options.temperature,
                            initial_prompt=options.prompt, encoder=options.encoder, **dict(options.params)).run()

    return ModelWorker(name, run, max_rows=max_rows, max_queue=max_queue, on_call=on_call,
                       joins=joins if continuous else None, run_joining=run_joining)


class _Requests:
    """The `AudioSource` of a joined call over the worker's queue (taking a request while at most `most` wait:
    `batching.most_waiting`)."""

    def __init__(self, joining: Joining, most: int | None):
        self.joining, self.most = joining, most

    def take(self):
        job = self.joining.take(lambda audio: True, self.most)
        return None if job is None else (job, job.payload)

    def finish(self, job: Job, transcript: Transcript) -> None:
        self.joining.finish(job, transcript)

    def gone(self, job: Job) -> bool:
        return job.gone

    def release(self, job: Job) -> None:
        self.joining.release(job)


def windows(audio: Audio) -> int:
    """The 30-s windows an audio takes at least (its rows in a call)."""
    return max(1, math.ceil(len(audio.samples) / (WINDOW_S * 16000)))


def passes_per_token(call: Call) -> float | None:
    """Target passes per generated token of a call's transcripts (1 for plain greedy decoding)."""
    tokens = sum(len(t.tokens) for t in call.result if isinstance(t, Transcript))
    passes = sum(t.passes for t in call.result if isinstance(t, Transcript))
    return passes / tokens if tokens else None


def language_name(code: str | None) -> str | None:
    """Whisper's name of language `code` ("en" -> "english"), as verbose_json reports it; an unknown code as it is,
    None for none."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return LANGUAGES.get(code, code) if code else None


def render(request: TranscriptionRequest, t: Transcript) -> tuple[Any, str]:
    """(body, media type) of the response in the request's format."""
    fmt = request.response_format
    if fmt == "text":
        return t.text.strip() + "\n", "text/plain; charset=utf-8"
    if fmt == "srt":
        return as_srt(t), "application/x-subrip; charset=utf-8"
    if fmt == "vtt":
        return as_vtt(t), "text/vtt; charset=utf-8"
    if fmt == "json":
        return {"text": t.text.strip()}, "application/json"
    body: dict[str, Any] = {"task": request.options.task, "language": language_name(t.language),
                            "duration": round(t.duration, 3), "text": t.text.strip()}
    if not request.granularities or "segment" in request.granularities:
        body["segments"] = [{"id": s.id, "seek": 0, "start": round(s.start, 3), "end": round(s.end, 3), "text": s.text,
                             "tokens": s.tokens, "temperature": s.temperature or 0.0,
                             "avg_logprob": s.avg_logprob, "compression_ratio": s.compression_ratio,
                             "no_speech_prob": s.no_speech_prob} for s in t.segments]
    if "word" in request.granularities:
        body["words"] = [{"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
                         for s in t.segments for w in s.words or []]
    body["mmaccel"] = {"method": request.options.method, "params": dict(request.options.params),
                       "encoder": request.options.encoder, "language_probability": t.language_probability,
                       "target_passes_per_token": round(t.passes / len(t.tokens), 4) if t.tokens else None}
    return body, "application/json"
