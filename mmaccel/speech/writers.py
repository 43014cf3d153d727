"""A transcript as the files users load elsewhere: plain text, SubRip (.srt), WebVTT (.vtt), tab-separated
segment times (.tsv, milliseconds) and JSON with segments and words (the layout openai-whisper writes).

>>> write_transcript(transcript, "out/", ["srt", "json"])      # out/<input name>.srt, out/<input name>.json
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from mmaccel.errors import check

if TYPE_CHECKING:
    from mmaccel.speech.transcript import Transcript

FORMATS = ("txt", "srt", "vtt", "tsv", "json")


def clock(seconds: float, decimal: str = ".", hours: bool = True) -> str:
    """01:02:03.456 (`decimal` "," for SubRip; without `hours`, 02:03.456 below an hour)."""
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    head = f"{h:02d}:" if hours or h else ""
    return f"{head}{m:02d}:{s:02d}{decimal}{ms:03d}"


def as_txt(t: Transcript) -> str:
    return "".join(s.text.strip() + "\n" for s in t.segments)


def as_srt(t: Transcript) -> str:
    return "".join(f"{i}\n{clock(s.start, ',')} --> {clock(s.end, ',')}\n{s.text.strip()}\n\n"
                   for i, s in enumerate(t.segments, 1))


def as_vtt(t: Transcript) -> str:
    cues = "".join(f"{clock(s.start, hours=False)} --> {clock(s.end, hours=False)}\n{s.text.strip()}\n\n"
                   for s in t.segments)
    return "WEBVTT\n\n" + cues


def as_tsv(t: Transcript) -> str:
    rows = "".join(f"{round(1000 * s.start)}\t{round(1000 * s.end)}\t{s.text.strip().replace(chr(9), ' ')}\n"
                   for s in t.segments)
    return "start\tend\ttext\n" + rows


def as_dict(t: Transcript) -> dict:
    """The transcript as JSON-ready data: text, language, duration and segments with their words."""
    segments = []
    for s in t.segments:
        item = asdict(s)
        item["words"] = None if s.words is None else [
            {"start": w.start, "end": w.end, "word": w.word, "probability": round(w.probability, 4)} for w in s.words]
        segments.append(item)
    return {"source": t.source, "text": t.text, "language": t.language, "duration": round(t.duration, 3),
            "segments": segments}


def as_json(t: Transcript) -> str:
    return json.dumps(as_dict(t), ensure_ascii=False) + "\n"


WRITERS = {"txt": as_txt, "srt": as_srt, "vtt": as_vtt, "tsv": as_tsv, "json": as_json}


def output_formats(value: str) -> list[str]:
    """A command line's --output-format (one of FORMATS, comma-separated ones, or "all")."""
    names = list(FORMATS) if value == "all" else [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in FORMATS]
    check(names and not bad, f"unknown output format {', '.join(bad) or value!r}; choose from {', '.join(FORMATS)} or all")
    return names


def write_transcript(t: Transcript, out_dir: str | os.PathLike, formats: list[str]) -> list[Path]:
    """Write `t` in each of `formats` as <out_dir>/<input's file name without suffix>.<format>."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = Path(t.source).stem if t.source != "array" else "array"
    paths = []
    for name in formats:
        path = out / f"{stem}.{name}"
        path.write_text(WRITERS[name](t), encoding="utf-8")
        paths.append(path)
    return paths
