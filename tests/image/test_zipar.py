"""ZipAR wavefront decoding: s = W is raster AR, pass counts, masking of undecoded positions, Jacobi windows."""

import pytest
import torch

from mmaccel.core.sampling import CFG, Sampling
from mmaccel.core.speculative import LoopConfig, decode
from mmaccel.errors import InputError
from mmaccel.image.models.gpt import GPTConfig, LlamaGenGPT
from mmaccel.image.zipar import zipar_decode, zipar_passes

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
    assert out.stats.nfe == zipar_passes(GRID, s) == GRID + (GRID - 1) * s
    assert all(len(r) == N and min(r) >= 0 for r in out.tokens)
    assert out.stats.new_tokens == len(LABELS) * N


def test_row_start_sees_only_decoded_positions(model):
    """The first token of row 1 is predicted from the class token, the s decoded tokens of row 0 and the
    stand-in (row 0's last decoded token at position W-1) — and nothing at the undecoded positions."""
    s = 2
    out = zipar_decode(model, LABELS, grid=GRID, s=s)
    for b, label in enumerate(LABELS):
        row0 = out.tokens[b][:s]
        state = model.prefill([label], 4)
        ref = model.step(state, torch.tensor([row0 + [row0[-1]]]), torch.tensor([list(range(s)) + [GRID - 1]]))
        assert int(ref[0, -1].argmax()) == out.tokens[b][GRID]
    # the first row only ever sees itself: it equals raster AR's first row
    base = decode(model, LABELS, LoopConfig(), max_new_tokens=N)
    assert [r[:GRID] for r in out.tokens] == [r[:GRID] for r in base.tokens]


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
