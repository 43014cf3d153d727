"""Whisper's pass by width as adaptive drafting reads it: a state of KV_LEN entries per row, measured once."""

import pytest
import torch

from mmaccel.engine.pass_costs import KV_LEN, WIDTHS
from mmaccel.speech.decoder import WhisperDecoderModel
from mmaccel.speech.pass_shape import filled_state, whisper_width_costs
from mmaccel.speech.timestamps import TimestampRules
from tests.speech.conftest import EOT, NO_TS, PROMPT, tiny_whisper


@pytest.fixture(scope="module")
def decoder():
    return WhisperDecoderModel(tiny_whisper(positions=64))        # room for KV_LEN and the widest pass


def test_the_timed_state_holds_kv_len_entries_per_row_and_a_pass_rolls_back(decoder):
    state = filled_state(decoder, PROMPT, rows=3)
    assert state.lengths.tolist() == [KV_LEN] * 3
    decoder.step(state, torch.ones(3, 5, dtype=torch.long))
    state.rollback(5)
    assert state.lengths.tolist() == [KV_LEN] * 3


def test_measured_by_width_and_keyed_by_what_the_pass_is(decoder, tmp_path, monkeypatch):
    monkeypatch.setenv("MMACCEL_CACHE", str(tmp_path))
    plain = whisper_width_costs(decoder, PROMPT, rows=2)
    assert plain.source == "measured" and sorted(plain.ms) == list(WIDTHS)
    assert whisper_width_costs(decoder, PROMPT, rows=2).source == "cache"
    rules = TimestampRules(NO_TS, EOT, len(PROMPT))
    assert whisper_width_costs(decoder, PROMPT, rows=2, rules=rules).source == "measured"
    assert whisper_width_costs(decoder, PROMPT, rows=1).source == "measured"
