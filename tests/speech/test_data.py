"""Manifests, the real clips, the sentence source and the TTS corpus builder."""

import functools
import json
import shutil

import numpy as np
import pytest

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech import text_sources
from mmaccel.speech.audio import load_audio
from mmaccel.speech.ctc.augment import augment
from mmaccel.speech.data import (
    EVAL_VOICES,
    FORTUNES,
    LICENSES,
    OOD_VOICES,
    SPHINX_DATA,
    TRAIN_VOICES,
    VOICES,
    Utterance,
    build_ood_corpus,
    build_tts_corpus,
    license_sentences,
    read_manifest,
    real_utterances,
    sentences,
    varied_sentences,
    write_manifest,
)


def test_manifest_round_trip_and_relative_paths(tmp_path):
    utts = [Utterance("a/x.wav", "hello there", 1.25, "x", "human")]
    path = write_manifest(tmp_path / "m.jsonl", utts)
    back = read_manifest(path)
    assert back[0].audio_filepath == str(tmp_path / "a/x.wav") and back[0].text == "hello there"
    assert json.loads(path.read_text())["duration"] == 1.25


def test_bad_manifests_are_named(tmp_path):
    with pytest.raises(InputError, match="manifest not found"):
        read_manifest(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"audio_filepath": "x.wav", "text": "hi", "duration": 1}\n{not json}\n')
    with pytest.raises(InputError, match="bad.jsonl:2: not valid JSON"):
        read_manifest(bad)
    bad.write_text('{"audio_filepath": "x.wav"}\n')
    with pytest.raises(InputError, match="missing field\\(s\\) text, duration"):
        read_manifest(bad)
    for line, match in (('[1, 2]', "expected a JSON object"), ('{"audio_filepath": null, "text": "a", "duration": 1}',
                        "audio_filepath must be a non-empty path"),
                        ('{"audio_filepath": "x.wav", "text": null, "duration": 1}', "text must be a string"),
                        ('{"audio_filepath": "x.wav", "text": "a", "duration": "long"}', "duration must be")):
        bad.write_text('{"audio_filepath": "x.wav", "text": "hi", "duration": 1}\n\n' + line + "\n")
        with pytest.raises(InputError, match=f"bad.jsonl:3: {match}"):
            read_manifest(bad)


def test_train_and_eval_voices_and_sentences_are_disjoint():
    assert not set(TRAIN_VOICES) & set(EVAL_VOICES) and set(TRAIN_VOICES) | set(EVAL_VOICES) <= set(VOICES)
    if not FORTUNES.is_dir():
        pytest.skip("apt-get install fortunes")
    train, held_out = sentences("train"), sentences("eval")
    assert len(train) > 2000 and len(held_out) > 250 and not set(train) & set(held_out)
    assert sentences("eval") == held_out                                    # stable order
    assert all(6 <= len(s.split()) <= 24 for s in held_out)


def test_real_utterances_have_transcripts():
    if not (SPHINX_DATA / "librivox").is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    utts = real_utterances()
    assert len(utts) >= 10 and all(u.text and u.duration > 0.5 and u.voice == "human" for u in utts)
    assert utts[1].text == "he was not an ill disposed young man"


def test_tts_corpus_is_built_and_resumed(tmp_path):
    if shutil.which("flite") is None or not FORTUNES.is_dir():
        pytest.skip("apt-get install flite fortunes")
    path = build_tts_corpus(tmp_path, "eval", voices=("flite-slt", "flite-rms"), max_sentences=2)
    utts = read_manifest(path)
    assert [u.voice for u in utts] == ["flite-slt", "flite-rms", "flite-slt", "flite-rms"]
    assert all(u.duration > 1.0 for u in utts)
    stamp = (tmp_path / "eval" / f"{utts[0].id}.wav").stat().st_mtime_ns
    build_tts_corpus(tmp_path, "eval", voices=("flite-slt", "flite-rms"), max_sentences=2)
    assert (tmp_path / "eval" / f"{utts[0].id}.wav").stat().st_mtime_ns == stamp      # not re-spoken
    with pytest.raises(InputError, match="unknown voice"):
        build_tts_corpus(tmp_path, "eval", voices=("robot",))


def test_the_out_of_domain_split_shares_no_text_or_training_voice(tmp_path):
    assert set(OOD_VOICES) <= set(VOICES) and not set(OOD_VOICES) & set(TRAIN_VOICES)
    if not LICENSES.is_dir() or not FORTUNES.is_dir() or shutil.which("espeak-ng") is None:
        pytest.skip("needs /usr/share/common-licenses, fortunes and espeak-ng")
    texts = license_sentences()
    assert len(texts) > 150 and len(set(texts)) == len(texts) and texts == license_sentences()
    assert not set(texts) & (set(sentences("train")) | set(sentences("eval")))
    path = build_ood_corpus(tmp_path, count=4)
    utts = read_manifest(path)
    assert [u.voice for u in utts] == list(OOD_VOICES[:4])
    assert [u.text for u in utts] == [texts[i * len(texts) // 4] for i in range(4)]           # spread over them
    noisy = [u.audio_filepath.endswith("_noisy.wav") for u in utts]
    assert noisy == [False, True, False, True]
    clean = load_audio(tmp_path / "ood" / f"ood_001_{OOD_VOICES[1]}.wav").samples
    assert not (load_audio(utts[1].audio_filepath).samples == clean).all()          # noise was added
    stamp = (tmp_path / "ood" / f"ood_000_{OOD_VOICES[0]}.wav").stat().st_mtime_ns
    assert read_manifest(build_ood_corpus(tmp_path, count=4)) == utts
    assert (tmp_path / "ood" / f"ood_000_{OOD_VOICES[0]}.wav").stat().st_mtime_ns == stamp   # not re-spoken
    with pytest.raises(InputError, match="count must be in"):
        build_ood_corpus(tmp_path, count=0)


@pytest.mark.slow     # 14 s of TTS
def test_the_varied_corpus_mixes_three_sources_and_augments_every_other_utterance(tmp_path, monkeypatch):
    if shutil.which("flite") is None or not FORTUNES.is_dir() or not LICENSES.is_dir():
        pytest.skip("apt-get install flite fortunes")
    for source in ("man_sentences", "docstring_sentences"):     # parse the stdlib and man pages once, not per call
        monkeypatch.setattr(text_sources, source, functools.cache(getattr(text_sources, source)))
    try:
        train, held_out = varied_sentences("train"), varied_sentences("eval")
    except ModelNotFoundError:
        pytest.skip("apt-get install manpages")
    assert len(train) > 8000 and len(held_out) > 800 and not set(train) & set(held_out)
    assert not set(train) & set(license_sentences())                          # the out-of-domain text stays unseen
    fortunes = set(sentences("train"))
    assert [s in fortunes for s in train[:6]] == [False, False, True] * 2      # man page, docstring, quotation
    assert not set(held_out) & fortunes and set(held_out) & set(sentences("eval"))
    path = build_tts_corpus(tmp_path, "train", voices=("flite-slt", "flite-rms"), max_sentences=4,
                            voices_per_sentence=1, text="varied", noisy=True)
    utts = read_manifest(path)
    assert path.name == "varied_train.jsonl" and [u.text for u in utts] == train[:4]
    assert [u.audio_filepath.endswith("_aug.wav") for u in utts] == [False, True, False, True]
    clean = [load_audio(tmp_path / "varied_train" / f"varied_train_{i:05d}_{v}.wav").samples
             for i, v in enumerate(["flite-slt", "flite-rms"] * 2)]
    for i in (1, 3):                                  # seeded by (seed, i), babble from the clean ones before
        want = augment(clean[i], np.random.default_rng([0, i]), clean[max(0, i - 5) : i : 2])
        assert np.allclose(load_audio(utts[i].audio_filepath).samples, want, atol=1e-4)
    assert read_manifest(build_tts_corpus(tmp_path, "train", voices=("flite-slt", "flite-rms"), max_sentences=4,
                                          voices_per_sentence=1, text="varied", noisy=True)) == utts   # resumed
    with pytest.raises(InputError, match="text must be one of"):
        build_tts_corpus(tmp_path, "train", text="news")
