"""`mmaccel asr transcribe | ctc | whisfusion`: one transcript per audio file, tab-separated after its path.

The summary (method, audio seconds, RTFx, decode statistics) goes to stderr as one JSON line; the
exit status is 1 when any input could not be transcribed (its line says why).
"""

from __future__ import annotations

import argparse
import json

from mmaccel.cli.options import add_draft_option, add_param_option, add_sampling_options, add_seed_option, key_value
from mmaccel.devices import add_device_option
from mmaccel.progress import progress, say
from mmaccel.speech.writers import FORMATS, output_formats, write_transcript


def print_transcripts(rows: list[tuple[str, str | None, str]]) -> int:
    """(source, error, text) per input, tab-separated; exit status 1 when any input failed."""
    for source, error, text in rows:
        print(f"{source}\tERROR: {error}" if error is not None else f"{source}\t{text}")
    return 1 if any(error is not None for _, error, _ in rows) else 0


def cmd_asr_transcribe(args: argparse.Namespace) -> int:
    from mmaccel.speech.pipeline import ASRPipeline, draft_option, heads_option

    asr = ASRPipeline.from_pretrained(args.model, heads=heads_option(args.heads), draft=draft_option(args.draft),
                                      assistant=args.assistant, device=args.device, cuda_graphs=args.cuda_graphs,
                                      precision=args.precision)
    if args.precision == "auto":
        say(f"precision: {asr.precision_reason}")
    formats = None if args.output_format is None else output_formats(args.output_format)
    language = None if args.language == "auto" else args.language
    with progress(desc="transcribe", unit="window") as bar:
        def advance(done: int, total: int) -> None:       # the total grows as long inputs go window by window
            bar.total = total
            bar.update(done - bar.n)

        out = asr.transcribe(list(args.files), args.method, batch_size=args.batch_size, language=language,
                             task=args.task, encoder=args.encoder,
                             timestamps=args.timestamps or formats not in (None, ["txt"]),
                             word_timestamps=args.word_timestamps, vad_filter=args.vad or bool(args.vad_param),
                             vad_parameters=dict(args.vad_param), adaptive=not args.fixed_k, progress=advance,
                             temperature=args.temperature, best_of=args.best_of, seed=args.seed,
                             compression_ratio_threshold=args.compression_ratio_threshold,
                             log_prob_threshold=args.log_prob_threshold, no_speech_threshold=args.no_speech_threshold,
                             initial_prompt=args.initial_prompt, **dict(args.param))
    status = print_transcripts([(t.source, t.error, t.text) for t in out.transcripts])
    for t in out.transcripts:
        if formats is not None and t.error is None:
            for path in write_transcript(t, args.output_dir, formats):
                say(f"wrote {path}")
    say(json.dumps({"method": out.method, "audio_s": round(out.audio_s, 3), "rtfx": round(out.rtfx, 3),
                    **out.stats.to_dict()}))
    return status


def cmd_asr_stream(args: argparse.Namespace) -> int:
    import sys
    import time

    import numpy as np

    from mmaccel.speech.audio import load_audio
    from mmaccel.speech.pipeline import ASRPipeline, draft_option, heads_option
    from mmaccel.speech.streaming import pcm_chunks, realtime_chunks

    asr = ASRPipeline.from_pretrained(args.model, heads=heads_option(args.heads), draft=draft_option(args.draft),
                                      device=args.device)
    if args.file == "-":
        chunks, rate = pcm_chunks(sys.stdin.buffer, args.sample_rate, args.chunk_s), args.sample_rate
    else:
        samples, rate = load_audio(args.file).samples, 16_000
        step = max(1, int(args.chunk_s * rate))
        chunks = (realtime_chunks(samples, rate, args.chunk_s) if args.realtime
                  else (samples[a : a + step] for a in range(0, len(samples), step)))
    t0, committed = time.perf_counter(), []
    for update in asr.stream(chunks, args.method, sample_rate=rate, language=args.language,
                             min_chunk_s=args.min_chunk_s, trim_s=args.trim_s, **dict(args.param)):
        for w in update.committed:
            if args.words:
                print(f"{w.start:.2f}\t{w.end:.2f}\t{w.delay:.2f}\t{w.word.strip()}", flush=True)
            else:
                print(w.word, end="", flush=True)
        committed += update.committed
        received = update.received_s
    if not args.words:
        print(flush=True)
    delays = [w.delay for w in committed]
    live = args.realtime or args.file == "-"
    say(json.dumps({"method": args.method, "audio_s": round(received, 3), "words": len(committed),
                    "wall_s": round(time.perf_counter() - t0, 3), "realtime": live,
                    **({"delay_median_s": round(float(np.median(delays)), 3),
                        "delay_p90_s": round(float(np.percentile(delays, 90)), 3)} if live and delays else {})}))
    return 0


def cmd_asr_ctc(args: argparse.Namespace) -> int:
    from mmaccel.speech.ctc.pipeline import CTCPipeline

    pipe = CTCPipeline.from_pretrained(args.model, device=args.device, lm=args.lm, lm_weight=args.lm_weight,
                                       insertion_bonus=args.insertion_bonus)
    params = dict(args.param) | ({} if args.beam is None else {"beam": args.beam})
    out = pipe.transcribe(list(args.files), args.method, boost=args.boost or None, boost_weight=args.boost_weight,
                          exit=None if args.exit_threshold is None else ("entropy", args.exit_threshold), **params)
    say(json.dumps({"method": out.method, "audio_s": round(out.audio_s, 3), "rtfx": round(out.rtfx, 3),
                    "time_s": {k: round(v, 4) for k, v in out.stats.time_s.items()},
                    **({"exit_layers": out.exit_layers} if out.exit_layers else {})}))
    return print_transcripts([(f, None, t.text) for f, t in zip(args.files, out.transcripts)])


def cmd_asr_whisfusion(args: argparse.Namespace) -> int:
    from mmaccel.speech.whisfusion.pipeline import WhisfusionPipeline

    pipe = WhisfusionPipeline.from_pretrained(args.model, device=args.device)
    out = pipe.transcribe(list(args.files), args.method, candidates=args.candidates, steps=args.steps,
                          temperature=args.temperature, select=args.select, batch_size=args.batch_size, seed=args.seed)
    say(json.dumps({"method": out.method, "audio_s": round(out.audio_s, 3), "rtfx": round(out.rtfx, 3),
                    **out.stats.to_dict()}))
    return print_transcripts([(t.source, t.error, t.text) for t in out.transcripts])


def add_parser(subparsers) -> None:
    asr = subparsers.add_parser("asr", help="speech recognition with Whisper")
    asr_sub = asr.add_subparsers(dest="asr_command", required=True)
    _add_transcribe(asr_sub)
    _add_stream(asr_sub)
    _add_ctc(asr_sub)
    _add_whisfusion(asr_sub)


def _add_transcribe(asr_sub) -> None:
    at = asr_sub.add_parser("transcribe", help="print one transcript per audio file (tab-separated after the path)")
    at.add_argument("files", nargs="+", help="audio files (wav, flac, ogg, mp3, ...); > 30 s is chunked")
    at.add_argument("--model", default="builtin:base", help="builtin:base, builtin:tiny.en or a local HF Whisper directory")
    at.add_argument("--heads", default="auto",
                    help="heads file(s), comma-separated (Medusa / exit / block / EAGLE), 'auto' (the shipped ones) or 'none'")
    add_draft_option(at, "auto", "draft decoder file for speculative/tree, 'auto' (shipped draft) or 'none'")
    at.add_argument("--assistant", default=None,
                    help="another Whisper for speculative-cross (builtin:tiny.en or a local HF Whisper directory)")
    at.add_argument("--method", default="greedy")
    add_param_option(at, "depth=4")
    at.add_argument("--fixed-k", action="store_true",
                    help="every pass of a draft method drafts its k (default: up to k, or none, as acceptance and "
                         "the measured pass costs say it pays; the transcript is the same)")
    at.add_argument("--batch-size", type=int, default=8)
    at.add_argument("--language", default="en", help="language code, or 'auto' to detect each file's (multilingual models)")
    at.add_argument("--task", default="transcribe", choices=("transcribe", "translate"),
                    help="translate: into English (multilingual models)")
    at.add_argument("--precision", default="fp32", choices=("auto", "fp32", "bf16", "int8"),
                    help="the model's precision: fp32 (as loaded), bf16 (the encoder, compiled; native bf16 only), int8 "
                         "(encoder and decoder, per-row weight and per-token scales) or auto (each part as fast as "
                         "it measured: the encoder bf16 where native, else fp32; the decoder int8); the cheaper "
                         "ones may change transcripts")
    at.add_argument("--encoder", default=None, choices=("auto", "fp32", "bf16", "int8"),
                    help="the encoder's precision alone (default: --precision's)")
    at.add_argument("--timestamps", action="store_true", help="decode with Whisper's timestamps (segments with times)")
    at.add_argument("--word-timestamps", action="store_true", help="word times from the alignment heads (implies --timestamps)")
    at.add_argument("--output-format", default=None, metavar="FORMAT",
                    help=f"also write each transcript as files: {', '.join(FORMATS)}, comma-separated, or all "
                         "(any but txt turns --timestamps on)")
    at.add_argument("--output-dir", default=".", help="where --output-format writes <input name>.<format>")
    at.add_argument("--vad", action="store_true",
                    help="decode only the speech Silero VAD finds (no text from long silences or noise)")
    at.add_argument("--vad-param", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                    help="a VAD parameter (mmaccel.speech.vad.VadParameters; implies --vad), "
                         "e.g. --vad-param min_silence_duration_ms=500")
    at.add_argument("--initial-prompt", default=None, metavar="TEXT",
                    help="text that conditions every window (names, spellings, style); not part of the transcript")
    _add_fallback_options(at)
    add_device_option(at)
    at.set_defaults(func=cmd_asr_transcribe)


def _temperatures(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"temperatures are numbers, comma-separated, got {text!r}") from None


def _threshold(text: str) -> float | None:
    if text == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a threshold is a number or 'none', got {text!r}") from None


def _add_fallback_options(parser: argparse.ArgumentParser) -> None:
    """Whisper's temperature fallback (`mmaccel.speech.fallback`), with openai-whisper's defaults."""
    parser.add_argument("--temperature", type=_temperatures, default=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
                        metavar="T[,T...]", help="decode at the first; a window that fails the thresholds is decoded "
                                                 "again at the next (default 0,0.2,0.4,0.6,0.8,1; 0: no fallback)")
    parser.add_argument("--best-of", type=int, default=5, help="samples per sampled temperature (the likeliest kept)")
    add_seed_option(parser, "seed of the sampled temperatures (the same seed gives the same transcript)")
    parser.add_argument("--compression-ratio-threshold", type=_threshold, default=2.4,
                        help="decode again when the text's gzip compression ratio is above this (a loop; 'none': never)")
    parser.add_argument("--log-prob-threshold", type=_threshold, default=-1.0,
                        help="decode again when the mean token log-probability is below this ('none': never)")
    parser.add_argument("--no-speech-threshold", type=_threshold, default=0.6,
                        help="leave a window empty when <|nospeech|> is above this and the log-probability below "
                             "--log-prob-threshold ('none': never)")


def _add_stream(asr_sub) -> None:
    st = asr_sub.add_parser("stream", help="live transcription: print words as they are committed (local agreement)")
    st.add_argument("file", help="an audio file, or - for raw 16-bit little-endian mono PCM on stdin (--sample-rate)")
    st.add_argument("--realtime", action="store_true",
                    help="play the file at its own pace (as a microphone would give it) and report word delays")
    st.add_argument("--model", default="builtin:base", help="builtin:base, builtin:tiny.en or a local HF Whisper directory")
    st.add_argument("--heads", default="auto", help="heads file(s), comma-separated, 'auto' or 'none'")
    add_draft_option(st, "auto", "draft decoder file, 'auto' or 'none'")
    st.add_argument("--method", default="greedy", help="any `asr transcribe` method; a lossless one commits greedy's words")
    add_param_option(st, "k=4")
    st.add_argument("--language", default="en")
    st.add_argument("--sample-rate", type=int, default=16_000, help="of the PCM on stdin")
    st.add_argument("--chunk-s", type=float, default=0.1, help="seconds of audio read at a time")
    st.add_argument("--min-chunk-s", type=float, default=1.0, help="decode again once this much new audio has come")
    st.add_argument("--trim-s", type=float, default=15.0, help="cut the decoded buffer once it is longer than this")
    st.add_argument("--words", action="store_true", help="one committed word a line: start, end, delay (s), word")
    add_device_option(st)
    st.set_defaults(func=cmd_asr_stream)


def _add_ctc(asr_sub) -> None:
    ac = asr_sub.add_parser("ctc", help="CTC transcription: greedy or batched beam search with an LM and boosting")
    ac.add_argument("files", nargs="+", help="audio files; > 30 s is cut into windows")
    ac.add_argument("--model", default="builtin:ctc-base",
                    help="builtin:ctc-base, a WhisperCTC directory or a transformers Wav2Vec2ForCTC directory")
    ac.add_argument("--method", default="beam", help="greedy or beam (`mmaccel methods --pipeline ctc`)")
    ac.add_argument("--beam", type=int, default=None, help="beam's hypotheses per frame (default 16)")
    add_param_option(ac, "recombine=sum")
    ac.add_argument("--lm", default=None, help="ARPA n-gram over the model's labels (characters for builtin:ctc-base)")
    ac.add_argument("--lm-weight", type=float, default=0.5)
    ac.add_argument("--insertion-bonus", type=float, default=0.0)
    ac.add_argument("--boost", action="append", default=[], metavar="PHRASE", help="phrase to boost (repeatable)")
    ac.add_argument("--boost-weight", type=float, default=1.0)
    ac.add_argument("--exit-threshold", type=float, default=None,
                    help="encoder early exit: leave after the first exit head whose mean entropy is below this")
    add_device_option(ac)
    ac.set_defaults(func=cmd_asr_ctc)


def _add_whisfusion(asr_sub) -> None:
    aw = asr_sub.add_parser("whisfusion", help="parallel masked-diffusion decoding (Whisfusion) on a Whisper encoder")
    aw.add_argument("files", nargs="+", help="audio files; > 30 s is chunked")
    aw.add_argument("--model", default="builtin:whisfusion-tiny.en", help="builtin:whisfusion-tiny.en or a saved directory")
    aw.add_argument("--method", default="whisfusion", help="`mmaccel methods --pipeline whisfusion`")
    aw.add_argument("--candidates", type=int, default=8, help="K candidate transcripts decoded side by side")
    aw.add_argument("--steps", type=int, default=4, help="refinement steps (decoder passes)")
    add_sampling_options(aw, temperature=1.0, top_k=None, top_p=None,
                         temperature_help="sampling temperature of candidates 1..K-1")
    aw.add_argument("--select", default="rover", choices=("rover", "confidence"))
    aw.add_argument("--batch-size", type=int, default=8)
    add_seed_option(aw)
    add_device_option(aw)
    aw.set_defaults(func=cmd_asr_whisfusion)
