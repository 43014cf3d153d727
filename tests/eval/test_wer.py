"""`mmaccel eval wer`: manifests and audio folders, per-utterance JSONL, resume, and bad input."""

import json
import shutil

import pytest

from mmaccel.cli import main
from mmaccel.errors import InputError
from mmaccel.eval.distributed import Dist
from mmaccel.eval.wer import evaluate_asr_method, load_utterances
from mmaccel.speech.data import read_manifest
from tests.eval.conftest import one_line_error


def test_manifest_utterances_sorted_longest_first(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"x")
    (tmp_path / "b.wav").write_bytes(b"x")
    (tmp_path / "c.wav").write_bytes(b"x")
    rows = [{"audio_filepath": "a.wav", "text": "one", "duration": 1.0, "id": "z"},
            {"audio_filepath": "b.wav", "text": "two", "duration": 2.5},
            {"audio_filepath": "c.wav", "text": "three", "duration": 1.0, "id": "y"}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    utts = load_utterances(tmp_path / "m.jsonl")
    assert [u.id for u in utts] == ["b", "y", "z"] and utts[0].audio_filepath == str(tmp_path / "b.wav")


@pytest.mark.parametrize("lines, match", [
    (['{"audio_filepath": "a.wav", "text": "x", "duration": 1}', '{"text": "y", "duration": 1}'],
     "m.jsonl:2: missing field(s) audio_filepath"),
    (['{"audio_filepath": "", "text": "x", "duration": 1}'], "m.jsonl:1: audio_filepath must be a non-empty path"),
    (['{"audio_filepath": "gone.wav", "text": "x", "duration": 1}'], "utterance 'gone': audio file not found"),
    (['{"audio_filepath": "a.wav", "text": "x", "duration": 1}', '{"audio_filepath": "a.wav", "text": "x", "duration": 1}'],
     "utterance id 'a' is used twice"),
])
def test_bad_manifests(tmp_path, capsys, lines, match):
    (tmp_path / "a.wav").write_bytes(b"x")
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=match.replace("(", r"\(").replace(")", r"\)")):
        load_utterances(tmp_path / "m.jsonl")
    assert main(["eval", "wer", "--audio", str(tmp_path / "m.jsonl"), "--out", str(tmp_path / "run")]) == 2
    one_line_error(capsys, match)
    assert not (tmp_path / "run").exists()


def test_audio_folder_with_sibling_references(tmp_path, short_clips_manifest):
    clips = read_manifest(short_clips_manifest)
    (tmp_path / "x" / "deep").mkdir(parents=True)
    shutil.copy(clips[0].audio_filepath, tmp_path / "x" / "one.wav")
    shutil.copy(clips[1].audio_filepath, tmp_path / "x" / "deep" / "two.wav")
    (tmp_path / "x" / "deep" / "two.txt").write_text(clips[1].text + "\n")
    (tmp_path / "x" / ".partial.wav").write_bytes(b"")
    utts = {u.id: u for u in load_utterances(tmp_path / "x")}
    assert set(utts) == {"one", "deep/two"}
    assert utts["one"].reference is None and utts["deep/two"].reference == clips[1].text
    assert utts["one"].duration == pytest.approx(clips[0].duration, abs=1e-3)


@pytest.mark.parametrize("make, extra, match", [
    (None, [], "--audio {} not found"),
    ("empty", [], "holds no audio files"),
    ("broken", [], "cannot read"),
    ("ok", ["--method", "teleport"], "unknown method"),
    ("ok", ["--batch-size", "0"], "--batch-size must be >= 1"),
])
def test_bad_input_is_one_line(tmp_path, capsys, make, extra, match):
    audio = tmp_path / "audio"
    if make is not None:
        audio.mkdir()
    if make == "broken":
        (audio / "a.wav").write_bytes(b"RIFF not audio")
    if make == "ok":
        (audio / "a.wav").write_bytes(b"x")
        (audio / "m.jsonl").write_text('{"audio_filepath": "a.wav", "text": "x", "duration": 1}\n')
        audio = audio / "m.jsonl"
    assert main(["eval", "wer", "--audio", str(audio), "--out", str(tmp_path / "run"), *extra]) == 2
    one_line_error(capsys, match.format(audio))


def test_utterances_summary_and_resume(tmp_path, tiny_en_asr, short_clips_manifest):
    clips = read_manifest(short_clips_manifest)[:2]
    manifest = tmp_path / "two.jsonl"
    manifest.write_text("".join(json.dumps({"audio_filepath": u.audio_filepath, "text": u.text,
                                            "duration": u.duration, "id": u.id}) + "\n" for u in clips))
    logs = []
    run = lambda **kw: evaluate_asr_method(tmp_path / "run", audio=manifest, method="greedy", params={},  # noqa: E731
                                           batch_size=1, dist=Dist(), model="builtin:tiny.en", pipeline=tiny_en_asr,
                                           log=logs.append, **kw)
    first = run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "utterances.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [u.id for u in sorted(clips, key=lambda u: (-u.duration, u.id))]
    for r in rows:
        assert r["hypothesis"] and r["reference"] and r["error"] is None and r["tokens"] >= 2
        assert r["passes"] == r["batch_passes"] == r["tokens"]          # greedy at batch 1: one pass per token
        assert {"features", "encoder", "decode"} <= set(r["times"])
    assert first["utterances"] == 2 and first["wer"]["utterances"] == 2 and first["failed"] == 0
    assert first["nfe"] == sum(r["passes"] for r in rows) and first["mean_accepted"] == 1.0 and first["rtfx"] > 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == first

    (tmp_path / "run" / "batches" / "batch_000001.json").unlink()
    second = run()
    assert (second["generated_batches"], second["resumed_batches"]) == (1, 1) and "1 transcribed, 1 resumed" in logs[-1]
    again = [json.loads(line) for line in (tmp_path / "run" / "utterances.jsonl").read_text().splitlines()]
    assert [r["hypothesis"] for r in again] == [r["hypothesis"] for r in rows] and second["wer"] == first["wer"]
    with pytest.raises(InputError, match=r"differs in: compare_greedy\)"):
        run(compare_greedy=True)
    compared = run(compare_greedy=True, overwrite=True)
    assert compared["identical_to_greedy"] == 2 and compared["greedy"]["wer"] == first["wer"]
    assert compared["decoder_speedup"] > 0 and compared["nfe_ratio"] == 1.0
    # with and without VAD: the clips are speech from end to end, so VAD keeps every word
    both = run(vad="both", overwrite=True)
    assert both["config"]["vad"] == "both" and both["vad"]["rtfx"] > 0
    assert abs(both["vad"]["wer"]["wer_percent"] - first["wer"]["wer_percent"]) <= 5.0 and both["wer"] == first["wer"]
    with pytest.raises(InputError, match="vad must be one of"):
        run(vad="yes", overwrite=True)
