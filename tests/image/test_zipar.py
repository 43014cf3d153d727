"""ZipAR wavefront decoding: s = W is raster AR, pass counts, masking of undecoded positions, Jacobi windows."""

import pytest
import torch

from mmaccel.core.sampling import CFG, Sampling
from mmaccel.core.speculative import LoopConfig, decode
from mmaccel.errors import InputError
from mmaccel.image.models.gpt import GPTConfig, LlamaGenGPT
from mmaccel.image.zipar import _decode_rows, zipar_decode, zipar_passes

torch.set_num_threads(1)

V, C, GRID = 48, 10, 6
N = GRID * GRID
LABELS = [1, 4, 8]
SAMPLED = Sampling(temperature=1.0)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=V, num_classes=C, block_size=N, multiple_of=32)
    m = LlamaGenGPT(cfg).eval()
    with torch.no_grad():
        m.output.weight.normal_(0, 0.5)
        m.cls_embedding.embedding_table.weight.normal_(0, 1.0)
        m.tok_embeddings.weight.normal_(0, 1.0)
    return m


def test_full_row_window_is_raster_ar(model):
    base = decode(model, LABELS, LoopConfig(), max_new_tokens=N)
    out = zipar_decode(model, LABELS, grid=GRID, s=GRID)
    assert out.tokens == base.tokens and out.stats.nfe == base.stats.nfe == N
    coupled_ar = decode(model, LABELS, LoopConfig(coupled=True), max_new_tokens=N, sampling=SAMPLED, seed=3)
    coupled = zipar_decode(model, LABELS, grid=GRID, s=GRID, sampling=SAMPLED, seed=3, coupled=True)
    assert coupled.tokens == coupled_ar.tokens


def test_full_row_window_with_cfg_is_raster_ar(model):
    guided = CFG(model, 2.5)
    inputs = (LABELS, [C] * len(LABELS))
    base = decode(guided, inputs, LoopConfig(), max_new_tokens=N)
    assert zipar_decode(guided, inputs, grid=GRID, s=GRID).tokens == base.tokens
    zipped = zipar_decode(guided, inputs, grid=GRID, s=2)
    assert zipped.stats.nfe == zipar_passes(GRID, 2) and all(t >= 0 for row in zipped.tokens for t in row)


@pytest.mark.parametrize("s", [1, 2, 3])
def test_pass_count_is_the_wavefront(model, s):
    out = zipar_decode(model, LABELS, grid=GRID, s=s, sampling=SAMPLED, seed=1)
    assert out.stats.nfe == zipar_passes(GRID, s) == 2 * GRID + (GRID - 2) * s
    assert all(len(r) == N and min(r) >= 0 for r in out.tokens)
    assert out.stats.new_tokens == len(LABELS) * N


@pytest.mark.parametrize("stand_in", ["vertical", "copy"])
def test_row_start_sees_only_decoded_positions(model, stand_in):
    """Row 2's first token is predicted from the class token, row 0, the s decoded tokens of row 1 and
    the stand-in at position 2W-1 — and nothing at the undecoded positions."""
    s = 2
    out = zipar_decode(model, LABELS, grid=GRID, s=s, stand_in=stand_in)
    for b, label in enumerate(LABELS):
        row0, row1 = out.tokens[b][:GRID], out.tokens[b][GRID : GRID + s]
        substitute = row0[-1] if stand_in == "vertical" else row1[-1]
        state = model.prefill([label], 2 * GRID)
        ref = model.step(state, torch.tensor([row0 + row1 + [substitute]]),
                         torch.tensor([list(range(GRID + s)) + [2 * GRID - 1]]))
        assert int(ref[0, -1].argmax()) == out.tokens[b][2 * GRID]
    # rows 0 and 1 never see a stand-in: they equal raster AR's
    base = decode(model, LABELS, LoopConfig(), max_new_tokens=N)
    assert [r[: 2 * GRID] for r in out.tokens] == [r[: 2 * GRID] for r in base.tokens]


class Recorder:
    """A model wrapper that keeps what every pass fed and the logits it returned (batch row 0)."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def prefill(self, inputs, room):
        return self.model.prefill(inputs, room)

    def step(self, state, tokens, positions=None, tree_mask=None):
        logits = self.model.step(state, tokens, positions, tree_mask)
        self.calls.append((tokens[0].tolist(), positions[0].tolist(), logits[0]))
        return logits


@pytest.mark.parametrize("stand_in", ["vertical", "copy"])
def test_one_short_window_is_ar_but_for_row_starts(model, stand_in):
    """With s = W - 1 every fed token's keys are computed over its full true context (the stand-in is
    overwritten in the pass that first needs the true token). So every logit row of every pass equals
    a full causal forward over the true tokens, except that a row start sees its stand-in in place of
    the missing last token of the row above."""
    for label, seed in zip(LABELS, (3, 4, 5)):
        recorder = Recorder(model)
        toks = zipar_decode(recorder, [label], grid=GRID, s=GRID - 1, sampling=SAMPLED, seed=seed, coupled=True,
                            stand_in=stand_in).tokens[0]
        full = model.forward([label], torch.tensor([toks[:-1]]))[0]               # row j predicts token j
        started = set()
        for fed, positions, logits in recorder.calls:
            for x, p, got in zip(fed, positions, logits):
                r = p // GRID + 1                                                  # the row p + 1 lies in
                if p % GRID == GRID - 1:                                           # the input of row r's start
                    if r >= 2 and r not in started:
                        started.add(r)
                        assert x == (toks[p - GRID] if stand_in == "vertical" else toks[p - 1])
                    ref = model.step(model.prefill([label], p + 1), torch.tensor([toks[:p] + [x]]),
                                     torch.tensor([list(range(p + 1))]))[0, -1]
                else:
                    assert x == toks[p]
                    ref = full[p + 1]
                assert torch.allclose(got, ref, atol=1e-4), (label, p)
        assert started == set(range(2, GRID)) and len(set(toks)) > GRID // 2                  # not degenerate


@pytest.mark.parametrize("s", [1, 2, GRID - 1, GRID])
@pytest.mark.parametrize("stand_in", ["vertical", "copy"])
def test_plain_schedule_equals_the_row_planner(model, s, stand_in):
    """Without drafts ZipAR runs a precomputed wavefront for the whole batch; it decodes exactly what
    the per-image row planner (the Jacobi path, with no drafts) does: greedy, coupled, and guided."""
    guided = CFG(model, 2.0)
    for m, inputs in ((model, LABELS), (guided, (LABELS, [C] * len(LABELS)))):
        for sampling, coupled in ((Sampling(), False), (SAMPLED, True)):
            fast = zipar_decode(m, inputs, grid=GRID, s=s, sampling=sampling, seed=7, coupled=coupled, stand_in=stand_in)
            rule = "greedy" if sampling.greedy else "coupled"
            ref = _decode_rows(m, inputs, GRID, s, 0, rule, {}, sampling, 7, coupled, stand_in)
            assert fast.tokens == ref.tokens and fast.commit_pass == ref.commit_pass
            assert fast.stats.nfe == ref.stats.nfe == zipar_passes(GRID, s)


def test_jacobi_windows_per_row(model):
    # with s = W the rows run one after the other: coupled Jacobi windows reproduce coupled AR sampling
    ar = decode(model, LABELS, LoopConfig(coupled=True), max_new_tokens=N, sampling=SAMPLED, seed=5)
    sjd = zipar_decode(model, LABELS, grid=GRID, s=GRID, jacobi=3, rule="coupled", sampling=SAMPLED, seed=5,
                       coupled=True)
    assert sjd.tokens == ar.tokens and sjd.stats.nfe <= ar.stats.nfe
    greedy = zipar_decode(model, LABELS, grid=GRID, s=GRID, jacobi=3)
    assert greedy.tokens == decode(model, LABELS, LoopConfig(), max_new_tokens=N).tokens
    both = zipar_decode(model, LABELS, grid=GRID, s=2, jacobi=2, sampling=SAMPLED, seed=5)
    assert all(len(r) == N and min(r) >= 0 for r in both.tokens)
    assert both.stats.nfe <= zipar_passes(GRID, 2)


def test_bad_parameters(model):
    with pytest.raises(InputError, match="window s"):
        zipar_decode(model, LABELS, grid=GRID, s=0)
    with pytest.raises(InputError, match="window s"):
        zipar_decode(model, LABELS, grid=GRID, s=GRID + 1)
    with pytest.raises(InputError, match="Jacobi window"):
        zipar_decode(model, LABELS, grid=GRID, s=2, jacobi=GRID)
    with pytest.raises(InputError, match="rule"):
        zipar_decode(model, LABELS, grid=GRID, s=2, rule="nope")
    with pytest.raises(InputError, match="stand-in"):
        zipar_decode(model, LABELS, grid=GRID, s=2, stand_in="nope")


def test_commit_pass_is_the_wavefront(model):
    """Row 0 (and row 1, which waits for it) commit one token per pass; later rows start s tokens behind
    the row above, so their column j commits s passes after the row above's."""
    s = 2
    out = zipar_decode(model, LABELS, grid=GRID, s=s, sampling=SAMPLED, seed=1)
    for passes in out.commit_pass:
        grid = torch.tensor(passes).reshape(GRID, GRID)
        assert grid[0].tolist() == list(range(1, GRID + 1)) and int(grid.max()) == out.stats.nfe
        assert grid[1].tolist() == list(range(GRID + 1, 2 * GRID + 1))
        for r in range(2, GRID):
            assert (grid[r] - grid[r - 1]).tolist() == [s] * GRID
