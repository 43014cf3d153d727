"""Audio input: formats, resampling, mono, chunking at pauses, and clear errors."""

import numpy as np
import pytest
import soundfile as sf
import torch

from mmaccel.errors import InputError
from mmaccel.speech.audio import SAMPLE_RATE, Audio, TimeMap, as_audio, is_silent, load_audio, log_mel, split_long


def tone(seconds: float, rate: int, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.mark.parametrize("suffix,subtype", [(".wav", "PCM_16"), (".flac", "PCM_16"), (".ogg", "VORBIS")])
def test_files_are_read_resampled_and_made_mono(tmp_path, suffix, subtype):
    stereo = np.stack([tone(1.5, 44100), tone(1.5, 44100, 220)], 1)
    path = tmp_path / f"clip{suffix}"
    sf.write(path, stereo, 44100, subtype=subtype)
    audio = load_audio(path)
    assert audio.samples.dtype == np.float32 and audio.samples.ndim == 1
    assert abs(audio.duration - 1.5) < 0.01 and audio.source == str(path)


def test_a_long_file_is_read_in_blocks_as_if_whole(tmp_path, monkeypatch):
    import soxr

    rng = np.random.default_rng(0)
    stereo = (0.1 * rng.standard_normal((48000 * 5 + 123, 2))).astype(np.float32)
    sf.write(tmp_path / "long.wav", stereo, 48000, subtype="FLOAT")
    monkeypatch.setattr("mmaccel.speech.audio.READ_BLOCK_S", 0.7)        # 8 blocks, the last a short one
    whole = soxr.resample(stereo.mean(axis=1), 48000, SAMPLE_RATE, quality="HQ")
    assert np.array_equal(load_audio(tmp_path / "long.wav").samples, whole)
    header_only = tmp_path / "lies.wav"                   # a header that promises an hour, 1 s of data
    with sf.SoundFile(tmp_path / "one.wav", "w", 16000, 1, "PCM_16") as f:
        f.write(tone(1.0, 16000))
    data = bytearray((tmp_path / "one.wav").read_bytes())
    data[40:44] = (3600 * 16000 * 2).to_bytes(4, "little")                # the data chunk's size
    header_only.write_bytes(bytes(data))
    lied = load_audio(header_only).samples
    assert abs(len(lied) / 16000 - 1.0) < 0.01 and (lied.base is None or lied.base.size <= 2 * len(lied))


def test_blocks_fill_one_array_that_grows_past_its_capacity():
    from mmaccel.speech.audio import _Filled

    blocks = [np.arange(n, dtype=np.float32) + 10 * n for n in (3, 0, 5, 9, 1)]
    filled = _Filled(4)
    for b in blocks:
        filled.add(b)
    assert np.array_equal(filled.samples(), np.concatenate(blocks)) and filled.samples().dtype == np.float32


def test_arrays_and_tensors_are_accepted_without_being_modified():
    x = tone(1.0, 8000)
    keep = x.copy()
    a = as_audio(x, 8000)
    assert len(a.samples) == SAMPLE_RATE and np.array_equal(x, keep)
    pcm = (x * 32767).astype(np.int16)
    b = as_audio((pcm, 8000))
    assert np.abs(b.samples - a.samples).max() < 1e-3
    c = as_audio(torch.from_numpy(x), sample_rate=8000)
    assert np.allclose(c.samples, a.samples)


def test_bad_audio_gets_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="audio file not found"):
        load_audio(tmp_path / "missing.wav")
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="audio file is empty"):
        load_audio(empty)
    text = tmp_path / "notes.wav"
    text.write_text("not audio at all")
    with pytest.raises(InputError, match="cannot read .*notes.wav as audio"):
        load_audio(text)
    with pytest.raises(InputError, match="needs its sample_rate"):
        as_audio(tone(1, 16000))
    with pytest.raises(InputError, match="sample rate must be an integer"):
        as_audio(tone(1, 16000), 12.5)
    with pytest.raises(InputError, match="looks like \\[channels, samples\\]"):
        as_audio(np.zeros((2, 16000), np.float32), 16000)
    with pytest.raises(InputError, match="NaN or inf"):
        as_audio(np.full(100, np.nan, np.float32), 16000)
    with pytest.raises(InputError, match="has no samples"):
        as_audio(np.zeros(0, np.float32), 16000)
    assert is_silent(as_audio(np.zeros(16000, np.float32), 16000))
    assert not is_silent(as_audio(tone(1, 16000), 16000))


def test_long_audio_is_cut_at_the_pause():
    speech, pause = tone(27.0, SAMPLE_RATE), np.zeros(SAMPLE_RATE, np.float32)
    audio = Audio(np.concatenate([speech, pause, tone(20.0, SAMPLE_RATE)]))
    chunks = split_long(audio)
    assert len(chunks) == 2 and 27.0 < chunks[0].duration < 28.0        # inside the pause
    assert np.array_equal(np.concatenate([c.samples for c in chunks]), audio.samples)
    assert all(c.duration <= 30 for c in split_long(Audio(tone(95.0, SAMPLE_RATE))))


def test_log_mel_refuses_a_window_longer_than_30_s():
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=80)
    assert tuple(log_mel(fe, [Audio(tone(2.0, SAMPLE_RATE))]).shape) == (1, 80, 3000)
    with pytest.raises(InputError, match="longer than one 30 s window"):
        log_mel(fe, [Audio(tone(31.0, SAMPLE_RATE))])


def test_log_mel_pads_a_short_clip_with_zeros_as_whisper_transcribe_does_or_with_silence():
    import torch
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor(feature_size=80)
    clip = Audio(tone(2.0037, SAMPLE_RATE))                  # not a whole number of hops
    n = len(clip.samples) // 160                              # the clip's frames
    alone = fe([clip.samples], sampling_rate=SAMPLE_RATE, return_tensors="pt")["input_features"]
    zeros, silence = log_mel(fe, [clip]), log_mel(fe, [clip], "silence")
    assert torch.equal(silence, alone) and bool(alone[..., n + 3:].eq(alone.min()).all())    # at the floor
    assert torch.equal(zeros[..., :n], alone[..., :n]) and not zeros[..., n:].any()
    assert alone.min() < -0.5                                 # so the two paddings differ
    with pytest.raises(InputError, match="padding 'reflect'"):
        log_mel(fe, [clip], "reflect")


def test_time_map_borders_snap_and_words():
    place = TimeMap(((0.0, 0.0, 7.0), (7.0, 27.0, 3.0)), snap=0.4)
    assert place(2.0) == 2.0 and place(8.0) == 28.0
    assert place(7.0) == 27.0 and place(7.0, end=True) == 7.0          # a border: start -> later, end -> earlier
    assert place(6.8) == 27.0                                           # a start in the padding: the next region
    assert place(7.2, end=True) == 7.0                                  # an end just into a region: the one before
    assert place(6.0) == 6.0 and place(8.0, end=True) == 28.0           # away from borders: as they are
    assert place(10.5, end=True) == 30.5                                # past the last piece: runs on
    assert place.span(6.7, 7.1) == (6.7, 7.1) and place.span(6.9, 7.5) == (26.9, 27.5)   # by the middle
    assert TimeMap(((0.0, 30.0, 25.0),))(24.0) == 54.0                   # a plain window: an offset
