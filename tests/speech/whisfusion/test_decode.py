"""Whisfusion's parallel decoding on a tiny random Whisper: the unmasking schedule, one step equals the
arg-max of one pass, candidates differ from step 0, seeds reproduce, selection and bad settings."""

import copy

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.speech.whisfusion.decode import still_masked, whisfusion_decode
from mmaccel.speech.whisfusion.model import MASK, WhisfusionDecoder
from tests.speech.conftest import EOT, PROMPT, features, tiny_whisper


@pytest.fixture(scope="module")
def setup():
    whisper = tiny_whisper()
    with torch.no_grad():
        enc = whisper.model.encoder(features(2)).last_hidden_state
    return WhisfusionDecoder(whisper, tokens_per_second=1.0, margin=4).eval(), enc


def text_of(ids):
    return " ".join(f"w{i}" for i in ids)


def decode(model, enc, **kw):
    return whisfusion_decode(model, enc, [3.0, 6.0], PROMPT, EOT, text_of, **kw)


def test_the_schedule_unmasks_everything_by_the_last_step():
    lengths = torch.tensor([1, 7, 40])
    for steps in (1, 2, 4, 8):
        left = [still_masked(lengths, s, steps) for s in range(steps)]
        assert (left[-1] == 0).all()
        assert all((a >= b).all() for a, b in zip(left, left[1:])) and (left[0] <= lengths).all()


def test_one_step_one_candidate_is_the_arg_max_of_one_pass(setup):
    model, enc = setup
    out = decode(model, enc, candidates=1, steps=1, select="confidence")
    for b, seconds in enumerate([3.0, 6.0]):
        L = model.canvas_length(seconds, len(PROMPT))
        ids = torch.tensor([PROMPT + [MASK] * L])
        cut, padding = model.cut_states(enc[b:b + 1], [seconds])
        with torch.no_grad():
            logits = model(ids, cut, cross_padding=padding)[0, len(PROMPT):]
        logits[:, EOT + 1:] = float("-inf")
        row = logits.argmax(-1).tolist()
        want = row[:row.index(EOT)] if EOT in row else row
        assert out.tokens[b] == want and out.texts[b] == text_of(want)
    assert out.passes == 1


def test_candidates_differ_from_step_zero_and_seeds_reproduce(setup):
    model, enc = setup
    a = decode(model, enc, candidates=6, steps=3, seed=1)
    b = decode(model, enc, candidates=6, steps=3, seed=1)
    c = decode(model, enc, candidates=6, steps=3, seed=2)
    assert a.candidates == b.candidates and a.texts == b.texts
    assert a.candidates != c.candidates
    assert all(len(set(row)) > 1 for row in a.candidates)                  # sampled rows are not copies
    greedy = decode(model, enc, candidates=1, steps=3)
    assert [row[0] for row in a.candidates] == [row[0] for row in greedy.candidates]   # candidate 0 is the arg-max
    assert a.passes == 3 and len(a.confidence[0]) == 6


def test_selection_by_confidence_and_by_vote(setup):
    model, enc = setup
    conf = decode(model, enc, candidates=5, steps=2, select="confidence")
    for b in range(2):
        best = max(range(5), key=lambda k: conf.confidence[b][k])
        assert conf.texts[b] == conf.candidates[b][best]
    voted = decode(model, enc, candidates=5, steps=2, select="rover", normalize=str.lower)
    assert voted.candidates == conf.candidates
    for b in range(2):
        assert set(voted.texts[b].split()) <= {w.lower() for c in voted.candidates[b] for w in c.split()}


@pytest.mark.parametrize("kw, message", [({"candidates": 0}, "candidates must be"), ({"steps": 0}, "steps must be"),
                                         ({"temperature": 0.0}, "temperature must be"),
                                         ({"select": "best"}, "unknown selection 'best'")])
def test_bad_settings_are_refused(setup, kw, message):
    model, enc = setup
    with pytest.raises(InputError, match=message):
        decode(model, enc, **kw)


def test_decoding_runs_on_a_cuda_device_and_reads_back_once_per_call(setup):
    """Every step is device work: what the host waits for does not grow with the steps."""
    from tests.emulated_cuda import emulated_cuda

    model, enc = setup
    want = decode(model, enc, candidates=3, steps=4, seed=5)
    seen = []
    for steps in (2, 4):
        with emulated_cuda() as report:
            got = whisfusion_decode(copy.deepcopy(model).to("cuda"), enc.cuda(), [3.0, 6.0], PROMPT, EOT, text_of,
                                    candidates=3, steps=steps, seed=5)
        if steps == 4:
            assert got.candidates == want.candidates and got.texts == want.texts
        seen.append((report.kinds(), report.uploads))
    assert seen[0] == seen[1], seen


def test_a_shortlist_limits_what_decoding_writes(setup, tmp_path):
    model, enc = setup
    allowed = [3, 5, 8, 13, 21, EOT]
    model.shortlist = torch.tensor(allowed)
    try:
        out = decode(model, enc, candidates=3, steps=2)
        model.save(tmp_path / "wf", "tiny")
        assert WhisfusionDecoder.load(tmp_path / "wf", tiny_whisper()).shortlist.tolist() == allowed
    finally:
        model.shortlist = None
    written = {int(w[1:]) for row in out.candidates for text in row for w in text.split()}
    assert written and written <= set(allowed) - {EOT}
