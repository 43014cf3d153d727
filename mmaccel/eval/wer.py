"""`mmaccel eval wer`: transcribe a test set with a speech method, score WER / RTFx, sharded.

Audio: a JSONL manifest (`audio_filepath`, `text`, `duration`, optional `id`; see
`mmaccel.speech.data.read_manifest`) or a folder searched recursively for audio files (wav, flac,
ogg, opus, mp3, aiff), whose reference is the text of a sibling `NAME.txt` when there is one (no
reference: the utterance is transcribed but not scored). Utterances are sorted by duration
(longest first, then id) and cut into fixed global batches of `--batch-size`, each transcribed by
one `ASRPipeline.transcribe` call; batches are shared by the ranks round robin (see `distributed`).
Outputs in `--out DIR` (see `rundir`):

    config.json                 method, parameters, model, and a digest of the utterance list
    batches/batch_000012.json   the batch's transcripts and DecodeStats; written last = batch done
    utterances.jsonl            one line per utterance, in the sorted order (rank 0 merges)
    summary.json                corpus WER (Whisper English normaliser), RTFx, passes, mean accepted

Per utterance: `passes` is the decoder target passes that committed its tokens where the pipeline
reports them per row (`Transcript.passes`), else the passes of its batch (equal at batch size 1);
`batch_passes` and `times` (the batch's `DecodeStats.time_s`: features, encoder, decode) are always
those of its batch, since a batch shares its passes. `tokens` counts the generated ids (end of text
included).

`--compare-greedy` also transcribes every batch with `greedy`, just before the method, in the same
process (one untimed warm-up call of each first), and reports the decoder and end-to-end speed-ups
(Σ greedy seconds / Σ method seconds) and how many transcripts are identical to greedy.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mmaccel.errors import InputError, check
from mmaccel.eval.distributed import Dist, progress
from mmaccel.eval.rundir import (
    BATCH_DIR,
    SUMMARY_FILE,
    Batch,
    plan_batches,
    prepare_run_dir,
    read_batch_record,
    total_stats,
    write_batch_record,
    write_bytes_atomic,
    write_json_atomic,
)

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif")
UTTERANCES_FILE = "utterances.jsonl"
OUTPUTS = (BATCH_DIR, UTTERANCES_FILE, SUMMARY_FILE)
VAD_MODES = ("off", "on", "both")


@dataclass(frozen=True)
class EvalUtterance:
    id: str
    audio_filepath: str
    reference: str | None
    duration: float


def load_utterances(audio: str | os.PathLike) -> list[EvalUtterance]:
    """The utterances of a manifest or an audio folder, checked (files exist, ids unique) and sorted
    longest first (ties by id)."""
    path = Path(audio).expanduser()
    if not path.exists():
        raise InputError(f"--audio {path} not found: pass a JSONL manifest or a folder of audio files")
    if path.is_dir():
        utts = _folder_utterances(path)
    else:
        from mmaccel.speech.data import read_manifest

        utts = [EvalUtterance(u.id, u.audio_filepath, u.text, float(u.duration)) for u in read_manifest(path)]
        for u in utts:
            check(Path(u.audio_filepath).is_file(), f"{path}: utterance {u.id!r}: audio file not found: {u.audio_filepath}")
    seen: dict[str, str] = {}
    for u in utts:
        check(u.id not in seen, f"{path}: utterance id {u.id!r} is used twice ({seen.get(u.id)} and {u.audio_filepath}); "
                                "ids must be unique")
        seen[u.id] = u.audio_filepath
    return sorted(utts, key=lambda u: (-u.duration, u.id))


def _folder_utterances(folder: Path) -> list[EvalUtterance]:
    import soundfile as sf

    files = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        files += [Path(dirpath) / n for n in filenames if not n.startswith(".") and n.lower().endswith(AUDIO_SUFFIXES)]
    check(len(files) > 0, f"--audio {folder} holds no audio files (looked for {', '.join(AUDIO_SUFFIXES)}, recursively)")
    utts = []
    for f in sorted(files):
        try:
            info = sf.info(str(f))
        except (sf.LibsndfileError, RuntimeError, TypeError) as err:
            raise InputError(f"cannot read {f} as audio ({err})") from None
        text_file = f.with_suffix(".txt")
        reference = text_file.read_text(encoding="utf-8").strip() if text_file.is_file() else None
        utts.append(EvalUtterance(f.relative_to(folder).with_suffix("").as_posix(), str(f), reference,
                                  round(info.frames / info.samplerate, 3)))
    return utts


def utterances_digest(utts: list[EvalUtterance]) -> str:
    """A digest of the sorted utterance list (ids, paths, references, durations) for config.json."""
    return hashlib.sha256(json.dumps([asdict(u) for u in utts]).encode()).hexdigest()[:16]


def evaluate_asr_method(out: str | Path, *, audio: str | os.PathLike, method: str, params: dict[str, Any],
                        batch_size: int, dist: Dist, model: str = "builtin:base", heads: str = "auto",
                        draft: str | None = "auto", assistant: str | None = None, language: str = "en",
                        compare_greedy: bool = False, overwrite: bool = False, pipeline=None,
                        log: Callable[[str], None] = print, device: str | None = None, vad: str = "off") -> dict | None:
    """Transcribe, save and score; returns the summary on rank 0 (None elsewhere). `pipeline`: an
    already loaded `ASRPipeline` to use instead of loading `model` / `heads` / `draft` / `assistant`.
    `vad`: "off", "on" (decode only the speech Silero VAD finds) or "both" (also a VAD run of every
    batch, whose WER and RTFx the summary reports under "vad")."""
    from mmaccel.speech.methods import build_asr_method
    from mmaccel.speech.pipeline import ASRPipeline, draft_option, heads_option

    check(vad in VAD_MODES, f"vad must be one of {VAD_MODES}, got {vad!r}")
    t_start = time.perf_counter()
    root = Path(out).expanduser()
    built = build_asr_method(method, **params)
    utts = load_utterances(audio)
    plan = plan_batches(len(utts), batch_size)
    asr = pipeline or ASRPipeline.from_pretrained(model, heads=heads_option(heads), draft=draft_option(draft),
                                                  assistant=assistant, device=dist.device(device))
    config = {"command": "eval wer", "audio": str(Path(audio).expanduser().resolve()), "utterances": len(utts),
              "utterances_digest": utterances_digest(utts), "order": "duration desc, then id", "model": model,
              "heads": asr.heads_source, "draft": asr.draft_source, "assistant": assistant, "method": method,
              "params": params, "batch_size": batch_size, "language": language, "compare_greedy": compare_greedy,
              "vad": vad, "device": asr.model.device.type}
    status = dist.on_main(lambda: prepare_run_dir(root, config, OUTPUTS, overwrite))
    if dist.is_main and status != "new":
        log(f"[eval wer] {root}: {'resuming' if status == 'resume' else 'overwrote the earlier run'}")

    def run_mine() -> dict[int, dict]:
        results, warm = {}, False
        for j in progress(dist.shard(len(plan)), dist, desc="eval wer batches"):
            record = read_batch_record(root, plan[j])
            generated = record is None
            if generated:
                if not warm:        # first calls pay one-off costs; keep them out of the timed batches
                    first = [utts[plan[j].start].audio_filepath]
                    asr.transcribe(first, method, batch_size=1, language=language, vad_filter=vad != "off", **params)
                    if compare_greedy:
                        asr.transcribe(first, "greedy", batch_size=1, language=language)
                    warm = True
                record = _run_batch(asr, root, plan[j], utts, method, params, language, compare_greedy, vad)
            results[j] = {"record": record, "generated": generated}
        return results

    batches = dist.gather_units(dist.agree(run_mine), len(plan))
    if not dist.is_main:
        return None
    records = [b["record"] for b in batches]
    generated = sum(b["generated"] for b in batches)
    log(f"[eval wer] {len(plan)} batches: {generated} transcribed, {len(plan) - generated} resumed "
        f"({dist.world_size} process{'es' if dist.world_size > 1 else ''})")
    rows = [row for r in records for row in r["rows"]]
    write_bytes_atomic(root / UTTERANCES_FILE, "".join(json.dumps(row) + "\n" for row in rows).encode("utf-8"))
    summary = _summary(records, rows, built.lossless, compare_greedy, vad)
    summary = {"command": "mmaccel eval wer", "out": str(root), "config": config, "batches": len(plan),
               "generated_batches": generated, "resumed_batches": len(plan) - generated,
               "processes": dist.world_size, "threads": dist.threads, **summary,
               "seconds": round(time.perf_counter() - t_start, 2)}
    write_json_atomic(root / SUMMARY_FILE, summary)
    return summary


def _run_batch(asr, root: Path, batch: Batch, utts: list[EvalUtterance], method: str, params: dict, language: str,
               compare_greedy: bool, vad: str) -> dict:
    items = utts[batch.start:batch.stop]
    paths = [u.audio_filepath for u in items]
    greedy = asr.transcribe(paths, "greedy", batch_size=len(items), language=language) if compare_greedy else None
    with_vad = asr.transcribe(paths, method, batch_size=len(items), language=language, vad_filter=True,
                              **params) if vad == "both" else None
    result = asr.transcribe(paths, method, batch_size=len(items), language=language, vad_filter=vad == "on", **params)
    times = {k: round(v, 6) for k, v in result.stats.time_s.items()}
    rows = []
    for k, (u, t) in enumerate(zip(items, result.transcripts)):
        passes = getattr(t, "passes", None)              # per row where the pipeline reports it
        row = {"id": u.id, "audio_filepath": u.audio_filepath, "reference": u.reference, "hypothesis": t.text,
               "duration": u.duration, "passes": None if t.error else result.stats.nfe if passes is None else passes,
               "batch_passes": result.stats.nfe, "tokens": len(t.tokens), "batch": batch.index, "times": times,
               "error": t.error}
        if greedy is not None:
            row["greedy_hypothesis"] = greedy.transcripts[k].text
        if with_vad is not None:
            row["vad_hypothesis"] = with_vad.transcripts[k].text
        rows.append(row)
    record = {"rows": rows, "stats": result.stats.to_dict(), "audio_s": result.audio_s, "wall_s": result.wall_s}
    if greedy is not None:
        record.update(greedy_stats=greedy.stats.to_dict(), greedy_wall_s=greedy.wall_s)
    if with_vad is not None:
        record.update(vad_wall_s=with_vad.wall_s)
    return write_batch_record(root, batch, record)


def _wer(rows: list[dict], key: str) -> dict | None:
    from mmaccel.metrics.wer import corpus_wer

    scored = [r for r in rows if r["reference"] is not None and r["error"] is None]
    if not scored:
        return None
    try:
        result = corpus_wer([r["reference"] for r in scored], [r[key] for r in scored])
    except InputError:                   # references without words: WER undefined
        return None
    return {**result.to_dict(), "wer_percent": round(100 * result.wer, 3)}


def _summary(records: list[dict], rows: list[dict], lossless: bool, compare_greedy: bool, vad: str) -> dict:
    from mmaccel.metrics.wer import normalizer_version

    stats = total_stats(records)
    audio_s = sum(r["audio_s"] for r in records)
    wall_s = sum(r["wall_s"] for r in records)
    failed = [r["id"] for r in rows if r["error"] is not None]
    out: dict[str, Any] = {
        "utterances": len(rows), "with_reference": sum(r["reference"] is not None for r in rows),
        "failed": len(failed), "failed_ids": failed[:20], "audio_s": round(audio_s, 3),
        "wer": _wer(rows, "hypothesis"), "normalizer": normalizer_version(), "lossless": lossless,
        "rtfx": round(audio_s / wall_s, 3) if wall_s else None, "transcription_s": round(wall_s, 3),
        "nfe": stats.nfe, "new_tokens": stats.new_tokens, "mean_accepted": round(stats.mean_accepted, 4),
        "passes_per_token": round(1 / stats.mean_accepted, 4) if stats.mean_accepted else None,
        "stats": stats.to_dict(summary=True),
    }
    if compare_greedy:
        greedy = total_stats(records, "greedy_stats")
        greedy_wall = sum(r["greedy_wall_s"] for r in records)
        decode, greedy_decode = stats.time_s.get("decode", 0.0), greedy.time_s.get("decode", 0.0)
        out["greedy"] = {"wer": _wer(rows, "greedy_hypothesis"), "nfe": greedy.nfe,
                         "rtfx": round(audio_s / greedy_wall, 3) if greedy_wall else None,
                         "transcription_s": round(greedy_wall, 3), "decode_s": round(greedy_decode, 3)}
        out["identical_to_greedy"] = sum(r["hypothesis"] == r["greedy_hypothesis"] for r in rows)
        out["decode_s"] = round(decode, 3)
        out["decoder_speedup"] = round(greedy_decode / decode, 3) if decode else None
        out["speedup"] = round(greedy_wall / wall_s, 3) if wall_s else None
        out["nfe_ratio"] = round(greedy.nfe / stats.nfe, 4) if stats.nfe else None
    if vad == "both":
        vad_wall = sum(r["vad_wall_s"] for r in records)
        out["vad"] = {"wer": _wer(rows, "vad_hypothesis"), "rtfx": round(audio_s / vad_wall, 3) if vad_wall else None,
                      "transcription_s": round(vad_wall, 3)}
    return out
