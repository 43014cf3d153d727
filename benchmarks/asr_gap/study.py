"""Issue 47 item 5, the WER gap: where our greedy and faster-whisper's transcripts differ on speech new to both.

A split of our own that no corpus, draft or head of the library has seen: 48 sentences of technical prose (the
package descriptions of this machine's Debian package database, not the man pages or docstrings the drafts train
on), spoken by four voices no split uses, each utterance degraded one way in turn: clean, reverberant (RT60
0.4-0.9 s), 10 % slower, 10 % faster, noisy (pink noise at 10-20 dB SNR) and reverberant at 10 % faster.

Whisper base on the same weights, English. Decoders:
- ours: greedy (no timestamps), greedy in timestamp mode, beam search (5 beams);
- faster-whisper float32 and int8: greedy as ours (beam 1, temperature 0, no timestamps, not conditioned on earlier
  text), greedy in timestamp mode, and its defaults as a new user runs it (`WhisperModel.transcribe(audio)`: 5 beams,
  timestamps, temperature fallback, conditioned on earlier text).

Where our greedy and faster-whisper float32's greedy (the same decoding rules) give different tokens, the first
token they differ at is looked up in our model's log-probabilities there: fp32 numerics can only flip near-ties, so
a small margin is numerics; a token one side suppresses is a rule; a large margin with no rule involved means the
model saw other input.

The finding (first run, 2026-11-29): with the log-mel of silence after a clip shorter than 30 s (what transformers'
feature extractor gives, our front end until then) 38 of 48 transcripts differed from faster-whisper float32's,
34 of them by a margin no numerics flip, none by suppression: the input differed. openai-whisper's `transcribe` and
faster-whisper pad a window's log-mel with zeros after the audio's frames; with that rule (`audio.log_mel`, now the
pipeline's default) our greedy gives faster-whisper float32's tokens. Both paddings are run here.

Usage: .venv/bin/python benchmarks/asr_gap/study.py --out benchmarks/asr_gap/study.json  (about 40 min on 2 cores)
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))          # this checkout's mmaccel

from mmaccel.bench.harness import device_name  # noqa: E402
from mmaccel.metrics.wer import corpus_wer, normalizer_version  # noqa: E402
from mmaccel.paths import default_cache_dir  # noqa: E402

COUNT = 48
PACKAGES = Path("/var/lib/dpkg/status")
# espeak-ng accents and variants that no split of `mmaccel.speech.data` uses
VOICES = (("nyc-m2", "en-us-nyc+m2"), ("gbclan-f4", "en-gb-x-gbclan+f4"), ("us-klatt2", "en-us+klatt2"),
          ("rp-m7", "en-gb-x-rp+m7"))
DEGRADATIONS = ("clean", "reverb", "slow", "fast", "noise", "reverb-fast")
NEAR_TIE = 0.05           # log-probability margin (nats) below which fp32 numerics can flip the arg-max


def description_sentences(status: Path = PACKAGES) -> list[str]:
    """Plain sentences of the long descriptions in a dpkg status file, in file order, once each."""
    from mmaccel.speech.text_sources import _LEGAL, plain_sentences

    out: list[str] = []
    for block in status.read_text(encoding="utf-8", errors="replace").split("\n\n"):
        lines = block.split("\n")
        starts = [i for i, line in enumerate(lines) if line.startswith("Description:")]
        body = []
        for line in lines[starts[0] + 1:] if starts else []:
            if not line.startswith(" "):
                break
            if line.strip() != ".":
                body.append(line.strip())
        out += [s for s in plain_sentences(" ".join(body)) if not _LEGAL.search(s) and s not in out]
    return out


def degrade(samples: np.ndarray, how: str, rng: np.random.Generator) -> np.ndarray:
    from mmaccel.speech.ctc.augment import add_noise, pink_noise, reverberate, room_impulse_response, speed_perturb

    if "reverb" in how:
        samples = reverberate(samples, room_impulse_response(float(rng.uniform(0.4, 0.9)), rng))
    if how in ("slow", "fast", "reverb-fast"):
        samples = speed_perturb(samples, 0.9 if how == "slow" else 1.1)
    if how == "noise":
        samples = add_noise(samples, pink_noise(len(samples), rng), float(rng.uniform(10, 20)))
    return samples.astype(np.float32)


def build_split(root: Path) -> list[dict]:
    """Synthesise the split under `root` (kept between runs); a dict per utterance."""
    import soundfile as sf

    from mmaccel.speech.audio import SAMPLE_RATE, load_audio
    from mmaccel.speech.data import Voice, synthesize

    texts = description_sentences()
    picked = [texts[i * len(texts) // COUNT] for i in range(COUNT)]
    out = []
    for i, text in enumerate(picked):
        name, voice_id = VOICES[i % len(VOICES)]
        how = DEGRADATIONS[(i // len(VOICES)) % len(DEGRADATIONS)]
        wav = root / f"gap_{i:03d}_{name}_{how}.wav"
        if not wav.is_file():
            clean = synthesize(text, Voice(f"espeak-{name}", "espeak-ng", voice_id), root / f"gap_{i:03d}_{name}.wav")
            samples = degrade(load_audio(clean).samples, how, np.random.default_rng([7, i]))
            sf.write(str(wav), samples, SAMPLE_RATE)
        out.append({"id": wav.stem, "voice": voice_id, "degradation": how, "text": text, "audio": load_audio(wav)})
    return out


def ours(utterances: list[dict]) -> tuple[dict, dict]:
    """Our decoders' texts, and greedy's generated tokens (no timestamps) by log-mel padding."""
    from mmaccel.speech.pipeline import ASRPipeline

    asr = ASRPipeline.from_pretrained("builtin:base")
    audios = [u["audio"] for u in utterances]
    texts, tokens = {}, {}
    for label, method, options, padding in (
            ("ours greedy", "greedy", {}, "zeros"), ("ours greedy, timestamps", "greedy", {"timestamps": True}, "zeros"),
            ("ours beam 5", "beam", {"num_beams": 5}, "zeros"), ("ours greedy, log-mel of silence", "greedy", {}, "silence")):
        asr.mel_padding = padding
        out = asr.transcribe(audios, method, batch_size=8, **options)
        texts[label] = out.texts
        if method == "greedy" and not options:
            tokens[padding] = {u["id"]: t.tokens for u, t in zip(utterances, out.transcripts)}
    return texts, tokens


def faster_whisper(utterances: list[dict]) -> tuple[dict, dict]:
    """faster-whisper's texts per configuration, and float32 greedy's tokens."""
    import torch
    from faster_whisper import WhisperModel

    from mmaccel.speech.whisper import ct2_model_dir

    greedy = dict(language="en", beam_size=1, temperature=0.0, condition_on_previous_text=False)
    configs = (("greedy", {**greedy, "without_timestamps": True}), ("greedy, timestamps", greedy),
               ("defaults", {"language": "en"}))
    texts, tokens = {}, {}
    for compute_type in ("float32", "int8"):
        model = WhisperModel(str(ct2_model_dir("base")), device="cpu", compute_type=compute_type,
                             cpu_threads=torch.get_num_threads())
        for name, options in configs:
            rows = []
            for u in utterances:
                segments = list(model.transcribe(u["audio"].samples, **options)[0])
                rows.append(" ".join(s.text.strip() for s in segments).strip())
                if compute_type == "float32" and name == "greedy":
                    tokens[u["id"]] = [t for s in segments for t in s.tokens]
            texts[f"faster-whisper {compute_type} {name}"] = rows
    return texts, tokens


def first_differences(utterances: list[dict], mine: dict, theirs: dict, padding: str) -> list[dict]:
    """For each utterance whose greedy tokens differ: where, both tokens, and our model's log-probabilities of
    them there (teacher-forced on our tokens, the log-mel padded as ours was)."""
    import torch

    from mmaccel.speech.audio import log_mel
    from mmaccel.speech.pipeline import ASRPipeline

    asr = ASRPipeline.from_pretrained("builtin:base")
    bundle = asr.bundle
    eot = bundle.tokens.end_of_text
    suppressed = set(bundle.model.generation_config.suppress_tokens or [])
    prompt = bundle.prompt("en")
    out = []
    for u in utterances:
        a = [t for t in mine[u["id"]] if t != eot]
        b = list(theirs[u["id"]])
        if a == b:
            continue
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        x, y = (a + [eot])[at], (b + [eot])[at]
        with torch.inference_mode():
            features = log_mel(bundle.feature_extractor, [u["audio"]], padding)
            logits = bundle.model(input_features=features, decoder_input_ids=torch.tensor([prompt + a[:at]])).logits
        logp = torch.log_softmax(logits[0, -1].float(), -1)
        tok = bundle.tokenizer.decode
        out.append({"id": u["id"], "degradation": u["degradation"], "position": at, "ours": tok([x]),
                    "faster_whisper": tok([y]), "margin": round(float(logp[x] - logp[y]), 4),
                    "theirs_suppressed_here": y in suppressed, "ours_text": tok(a).strip(), "theirs_text": tok(b).strip()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    root = default_cache_dir() / "speech" / "gap"
    root.mkdir(parents=True, exist_ok=True)
    utterances = build_split(root)
    refs = [u["text"] for u in utterances]
    texts, our_tokens = ours(utterances)
    peer, their_tokens = faster_whisper(utterances)
    texts.update(peer)
    differences = {padding: first_differences(utterances, tokens, their_tokens, padding)
                   for padding, tokens in our_tokens.items()}

    def wer(rows: list[str], keep=lambda u: True) -> float:
        pairs = [(r, h) for u, r, h in zip(utterances, refs, rows) if keep(u)]
        return round(100 * corpus_wer([r for r, _ in pairs], [h for _, h in pairs]).wer, 2)

    table = {label: {"wer": wer(rows), **{how: wer(rows, lambda u, h=how: u["degradation"] == h)
                                           for how in DEGRADATIONS}} for label, rows in texts.items()}

    def compared(differences: list[dict]) -> dict:
        return {"same_tokens": len(utterances) - len(differences), "differ": len(differences),
                "near_ties": sum(abs(d["margin"]) < NEAR_TIE for d in differences),
                "their_token_suppressed_by_us": sum(d["theirs_suppressed_here"] for d in differences),
                "first_differences": differences}

    doc = {"command": "python benchmarks/asr_gap/study.py --out benchmarks/asr_gap/study.json",
           "device": device_name(), "model": "builtin:base", "wer": f"corpus WER, {normalizer_version()}",
           "split": {"utterances": len(utterances), "text": f"package descriptions of {PACKAGES}",
                     "voices": [v for _, v in VOICES], "degradations": list(DEGRADATIONS)},
           "wer_by_decoder": table,
           "greedy_vs_faster_whisper_float32": {padding: compared(d) for padding, d in differences.items()},
           "utterances": [{k: v for k, v in u.items() if k != "audio"} | {label: rows[i] for label, rows in texts.items()}
                          for i, u in enumerate(utterances)]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for label, row in table.items():
        print(f"{label:42s} " + " ".join(f"{k}={v}" for k, v in row.items()))
    for padding, row in doc["greedy_vs_faster_whisper_float32"].items():
        print(padding, {k: v for k, v in row.items() if k != "first_differences"})


if __name__ == "__main__":
    main()
