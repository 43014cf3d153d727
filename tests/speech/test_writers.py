"""Transcripts as files: the formats' layouts on a hand-built transcript, then `mmaccel asr transcribe
--output-format all --word-timestamps` on a real clip."""

import json

import pytest

from mmaccel.cli import main
from mmaccel.errors import InputError
from mmaccel.speech.alignment import Word
from mmaccel.speech.timestamps import Segment
from mmaccel.speech.transcript import Transcript
from mmaccel.speech.writers import as_srt, as_tsv, as_txt, as_vtt, clock, output_formats, write_transcript
from tests.speech.test_pipeline import FILES, LIBRIVOX


def _transcript() -> Transcript:
    words = [Word(0.0, 0.4, " Hello", 0.9, [1]), Word(0.4, 1.25, " there.", 0.8, [2, 3])]
    segments = [Segment(0, 0.0, 1.25, " Hello there.", [50364, 1, 2, 3, 50426], -0.2, 1.1, 0.01, words),
                Segment(1, 3661.5, 3662.0, " Bye\tnow.", [4], -0.3, 0.9, 0.02, [])]
    return Transcript("Hello there. Bye now.", "/data/talk.wav", 3662.0, segments=segments, language="en")


def test_clock_times_have_milliseconds_and_hours_where_asked():
    assert clock(3661.5) == "01:01:01.500" and clock(3661.5, ",") == "01:01:01,500"
    assert clock(61.0004, hours=False) == "01:01.000" and clock(3600, hours=False) == "01:00:00.000"


def test_each_format_lays_the_segments_out_as_its_readers_expect():
    t = _transcript()
    assert as_txt(t) == "Hello there.\nBye\tnow.\n"
    assert as_srt(t) == ("1\n00:00:00,000 --> 00:00:01,250\nHello there.\n\n"
                         "2\n01:01:01,500 --> 01:01:02,000\nBye\tnow.\n\n")
    assert as_vtt(t).startswith("WEBVTT\n\n00:00.000 --> 00:01.250\nHello there.\n\n01:01:01.500 --> ")
    assert as_tsv(t) == "start\tend\ttext\n0\t1250\tHello there.\n3661500\t3662000\tBye now.\n"


def test_json_carries_segments_and_words_and_files_are_named_after_the_input(tmp_path):
    paths = write_transcript(_transcript(), tmp_path / "out", output_formats("all"))
    assert [p.name for p in paths] == [f"talk.{f}" for f in ("txt", "srt", "vtt", "tsv", "json")]
    doc = json.loads((tmp_path / "out" / "talk.json").read_text())
    assert doc["language"] == "en" and doc["segments"][0]["avg_logprob"] == -0.2
    assert doc["segments"][0]["words"][1] == {"start": 0.4, "end": 1.25, "word": " there.", "probability": 0.8}
    assert output_formats("srt, json") == ["srt", "json"]
    with pytest.raises(InputError, match="unknown output format 'docx'"):
        output_formats("srt,docx")


def test_the_cli_writes_every_format_with_word_times(tmp_path, capsys):
    if not LIBRIVOX.is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    clip = FILES[1]
    code = main(["asr", "transcribe", clip, "--model", "builtin:tiny.en", "--heads", "none", "--draft", "none",
                 "--word-timestamps", "--output-format", "all", "--output-dir", str(tmp_path)])
    assert code == 0
    stem = clip.rsplit("/", 1)[1][:-4]
    doc = json.loads((tmp_path / f"{stem}.json").read_text())
    words = [w for s in doc["segments"] for w in s["words"]]
    assert doc["text"] and words and all(w["start"] <= w["end"] for w in words)
    assert (tmp_path / f"{stem}.srt").read_text().startswith("1\n00:00:00,")
    assert doc["text"] in capsys.readouterr().out
