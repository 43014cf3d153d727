"""Speech tab: Whisper on an uploaded, recorded or bundled clip, greedy next to a method: transcripts with a
word diff, decoder passes per token, decoder speed-up and RTFx; the method's segments with their times (and
words) and its subtitles as SRT / VTT files."""

from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr

from demos.render import word_diff
from demos.shared import SharedModel, choice, method_help, method_menu, parse_params, ratio, reported_rows, shown_on_page
from mmaccel.errors import InputError
from mmaccel.speech.audio import is_silent, load_audio
from mmaccel.speech.data import real_utterances
from mmaccel.speech.pipeline import ASRPipeline
from mmaccel.speech.writers import write_transcript

REGISTRY = ASRPipeline.methods()
BASELINE = "greedy"             # every transcript is shown next to the baseline's
# what the app's Whisper loads (`from_pretrained`: the shipped heads, EAGLE head and draft decoder); a method that
# needs anything else (speculative-cross: an assistant Whisper) is not offered
LOADED = ("draft", "heads", "exit_heads", "medusa_block", "eagle")
METHODS = method_menu(REGISTRY, LOADED, skip=(BASELINE,))
# the best lossless (or stated) setting in benchmarks/asr_base.json, editable on the page; other methods start
# from their defaults
DEFAULT_PARAMS = {"eagle": "k=8 stop_below=0.5", "speculative": "k=8 stop_below=0.8 siblings=2",
                  "medusa": "depth=1 width=1", "medusa-block": "depth=2 width=1", "early-exit": "k=2 exit_layer=5",
                  "calm": "threshold=0.9", "beam": "num_beams=5", "ngram": "k=3", "tree": "depth=4 width=2"}
MAX_AUDIO_S = 600.0             # longer uploads are refused with a message (the app is a demo, not a batch job)


def speech_model(source: str, device: str | None = None) -> SharedModel:
    def load() -> ASRPipeline:
        asr = ASRPipeline.from_pretrained(source, device=device)
        clips = bundled_clips()
        if clips:                 # warm-up: first-call costs (int8 draft weights, allocator) stay out of the speed-up
            first = min(clips.values(), key=len)
            for method in (BASELINE, "eagle" if asr.heads.eagle is not None else "ngram"):
                asr.transcribe(first, method, batch_size=1)
        return asr

    return SharedModel("speech", load)


def bundled_clips() -> dict[str, str]:
    """Label -> path of the real clips the Debian data packages carry (LibriVox, pocketsphinx, ALSA)."""
    return {f"{u.id} ({u.duration:.1f} s): {u.text[:48]}": u.audio_filepath for u in real_utterances()}


def _stats_table(method: str, base, fast) -> str:
    decode = lambda out: out.stats.time_s.get("decode", 0.0)  # noqa: E731
    rows = [("decoder passes per token", f"{1 / base.stats.mean_accepted:.3f}", f"{1 / fast.stats.mean_accepted:.3f}"),
            ("decoder time (s)", f"{decode(base):.2f}", f"{decode(fast):.2f}"),
            ("decoder speed-up", "1.00×", ratio(decode(base), decode(fast))),
            ("end-to-end speed-up", "1.00×", ratio(base.wall_s, fast.wall_s)),
            ("RTFx (audio s / compute s)", f"{base.rtfx:.1f}", f"{fast.rtfx:.1f}"),
            *reported_rows(base.stats, fast.stats),
            ("identical to greedy", "–", "yes" if fast.texts == base.texts else "no")]
    lines = [f"| | {BASELINE} | {method} |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def segment_rows(transcript) -> list[list]:
    """[start s, end s, text] per segment; with word times, the words after the text as word@start."""
    rows = []
    for s in transcript.segments:
        words = " ".join(f"{w.word.strip()}@{w.start:.2f}" for w in s.words or [])
        rows.append([f"{s.start:.2f}", f"{s.end:.2f}", s.text.strip(), words])
    return rows


def subtitles(transcript) -> list[str]:
    """The transcript as .srt and .vtt files in a fresh temporary directory (for the download box)."""
    out = tempfile.mkdtemp(prefix="mmaccel-subtitles-")
    return [str(p) for p in write_transcript(transcript, out, ["srt", "vtt"])]


def build(model: SharedModel) -> None:
    """The tab's controls and events (call inside a gr.Blocks / gr.Tab)."""
    clips = bundled_clips()
    first = next(iter(clips), None)          # the page opens with a clip selected: Transcribe works at once
    with gr.Row():
        with gr.Column(scale=1):
            audio = gr.Audio(clips.get(first), sources=["upload", "microphone"], type="filepath",
                             elem_id="speech-audio", label=f"audio (upload or record; up to {MAX_AUDIO_S / 60:.0f} minutes)")
            clip = gr.Dropdown(list(clips), value=first, label="or a bundled real clip", elem_id="speech-clip")
            method = gr.Dropdown(list(METHODS), value="eagle", label="method", elem_id="speech-method")
            params = gr.Textbox(DEFAULT_PARAMS["eagle"], label="method parameters (KEY=VALUE)")
            about = gr.Markdown(method_help(REGISTRY["eagle"]), elem_id="speech-method-help")
            timed = gr.Checkbox(True, label="segments with word times (Whisper's timestamp mode)", elem_id="speech-timed")
            vad = gr.Checkbox(False, label="voice activity detection (Silero VAD: skip silence and noise)",
                              elem_id="speech-vad")
            run = gr.Button("Transcribe", variant="primary", elem_id="speech-run")
        with gr.Column(scale=2):
            with gr.Row():
                base_text = gr.Textbox(label="greedy", lines=4, elem_id="speech-greedy")
                fast_text = gr.Textbox(label="method", lines=4, elem_id="speech-method")
            diff = gr.HighlightedText(label="word diff (method against greedy: + added, − dropped)",
                                      color_map={"+": "#a6dba0", "-": "#fbb4ae"}, elem_id="speech-diff")
            stats = gr.Markdown(elem_id="speech-stats")
            segments = gr.Dataframe(headers=["start (s)", "end (s)", "text", "words (word@start s)"],
                                    label="segments of the method's transcript", wrap=True, elem_id="speech-segments")
            files = gr.File(label="subtitles (SRT, VTT)", file_count="multiple", elem_id="speech-subtitles")

    clip.change(lambda label: clips.get(label), clip, audio, queue=False)
    method.change(lambda m: (DEFAULT_PARAMS.get(m, ""), method_help(REGISTRY[m]) if m in REGISTRY else ""), method,
                  [params, about], queue=False)

    @shown_on_page
    def transcribe(path, method, params_text, timed=True, vad=False, progress=gr.Progress()):
        method = choice(method, "method", METHODS)
        params = parse_params(params_text)
        if not path:
            raise InputError("no audio: upload or record a clip, or pick a bundled one")
        try:
            audio = load_audio(path)            # a missing, empty or non-audio file is a clear InputError
        except InputError as err:               # named as the user knows it, not by the server's upload path
            raise InputError(str(err).replace(str(path), Path(path).name)) from None
        if audio.duration > MAX_AUDIO_S:
            raise InputError(f"the audio is {audio.duration / 60:.1f} minutes long; this page takes up to "
                             f"{MAX_AUDIO_S / 60:.0f} (use `mmaccel asr transcribe` or `mmaccel eval wer` for longer)")
        if audio.duration == 0 or is_silent(audio):
            raise InputError("the audio is silent: nothing to transcribe")
        progress(0.0, desc="loading Whisper")
        with model.use() as asr:
            runs = {}
            for i, (name, kw) in enumerate(((BASELINE, {}), (method, params))):
                report = lambda done, total, i=i, name=name: progress(  # noqa: E731
                    (i + done / total) / 2, desc=f"{name}: {done}/{total} 30-s windows")
                runs[name] = asr.transcribe(audio, name, batch_size=1, progress=report, word_timestamps=bool(timed),
                                            vad_filter=bool(vad), **kw)
        base, fast = runs[BASELINE], runs[method]
        transcript = fast.transcripts[0]
        return (base.texts[0], gr.update(value=fast.texts[0], label=method), word_diff(base.texts[0], fast.texts[0]),
                _stats_table(method, base, fast), segment_rows(transcript), subtitles(transcript))

    run.click(transcribe, [audio, method, params, timed, vad], [base_text, fast_text, diff, stats, segments, files],
              api_name="speech")
