"""The int8 decoder's compiled pass (`mmaccel.speech.decoder_graph`): close to the eager int8 pass, a token's logits
bitwise the same in any pass of the graph (greedy-identity on this engine), and the cache operations methods use."""

import pytest
import torch

from mmaccel.engine.compiled import available
from mmaccel.speech.decoder import WhisperDecoderModel
from mmaccel.speech.decoder_graph import GraphCache
from tests.speech.conftest import PROMPT, features

pytestmark = pytest.mark.skipif(not available(), reason="the compiled pass needs OpenVINO")


@pytest.fixture(scope="module")
def graphed(tiny_hf, tmp_path_factory):
    model = WhisperDecoderModel(tiny_hf, quantized=True, fixed_shape=True)
    assert model.compile_graph(tmp_path_factory.mktemp("compiled"))
    return model


def _alone(model, audio, tokens):
    """Each row alone, one token per pass: [B, 1 + T, V] (after the prompt, then after each token)."""
    out = []
    for b in range(tokens.shape[0]):
        state = model.prefill(audio.select_rows(torch.tensor([b]), model.device), tokens.shape[1] + 1)
        assert isinstance(state.cache, GraphCache)
        rows = [state.logits] + [model.step(state, tokens[b:b + 1, t:t + 1])[:, 0] for t in range(tokens.shape[1])]
        out.append(torch.stack(rows, 1)[0])
    return out


def test_a_token_gets_the_same_logits_in_any_pass_of_the_graph(graphed):
    audio = graphed.encode(features(3, seed=6), PROMPT)
    tokens = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(3))
    alone = _alone(graphed, audio, tokens)
    state = graphed.prefill(audio, 12)
    assert torch.equal(state.logits, torch.stack([a[0] for a in alone]))
    wide = graphed.step(state, tokens)                   # ten tokens: two chunks of the graph's width
    assert all(torch.equal(wide[b], alone[b][1:]) for b in range(3))
    state.rollback(torch.tensor([6, 4, 8]))              # rows at 4, 6 and 2 tokens: ragged
    starts = [4, 6, 2]
    ragged = graphed.step(state, torch.stack([tokens[b, s:s + 4] for b, s in enumerate(starts)]))
    assert all(torch.equal(ragged[b], alone[b][s + 1:s + 5]) for b, s in enumerate(starts))


def test_the_graph_stays_close_to_the_eager_int8_pass(graphed):
    eager = graphed.eager()
    audio = graphed.encode(features(2, seed=2), PROMPT)
    tokens = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(1))
    want = eager.step(eager.prefill(audio, 8), tokens)
    state = graphed.prefill(audio, 8)
    got = graphed.step(state, tokens)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))                   # the same tokens suppressed
    assert float((got[finite] - want[finite]).norm() / want[finite].norm()) < 0.05
    assert state.hidden.shape == (2, 5, graphed.hidden_size)
    features_view = graphed.feature_view((0, 2))
    state = features_view.prefill(audio, 8)
    features_view.step(state, tokens)
    assert state.hidden.shape == (2, 5, 3 * graphed.hidden_size)


@pytest.mark.parametrize("in_place", [True, False], ids=["state-in-place", "state-copied"])
def test_rows_selected_joined_and_compacted_keep_their_entries(graphed, in_place, monkeypatch):
    from mmaccel.engine.stateful import Session

    if not in_place:        # a runtime that hands out copies of its state: whole-state reads and writes
        monkeypatch.setattr(Session, "state_views", lambda self: None)
    audio = graphed.encode(features(2, seed=4), PROMPT)
    tokens = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(2))
    alone = _alone(graphed, audio, tokens)
    state = graphed.prefill(audio, 10)
    assert (state.cache.session.state_views() is not None) == in_place      # OpenVINO's CPU state: its own memory
    graphed.step(state, tokens[:, :3])
    graphed.select_rows(state, torch.tensor([1, 1, 0]))          # beam search: rows repeated, reordered
    got = graphed.step(state, tokens[[1, 1, 0], 3:])
    assert torch.equal(got[0], alone[1][4:]) and torch.equal(got[1], alone[1][4:]) and torch.equal(got[2], alone[0][4:])
    joining = graphed.encode(features(1, seed=9), PROMPT)
    first = graphed.admit(state, 2, joining)                      # a window joins row 2
    fresh = graphed.prefill(joining, 4)
    assert torch.equal(first.logits, fresh.logits)
    assert torch.equal(graphed.step(state, tokens[[1, 1, 0], :1])[2], graphed.step(fresh, tokens[:1, :1])[0])
    # tree compaction: a root and two children; keeping the second child, the next token sees it where the first was
    state = graphed.prefill(audio, 10)
    tree = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)
    graphed.step(state, torch.stack([tokens[:, 0], tokens[:, 5], tokens[:, 1]], 1), tree_mask=tree)
    state.keep_appended(torch.tensor([[0, 2], [0, 2]]), torch.tensor([2, 2]), 3)
    assert torch.equal(graphed.step(state, tokens[:, 2:3])[:, 0], torch.stack([a[3] for a in alone]))


def test_a_batch_that_does_not_compile_runs_eagerly_with_one_line(graphed, monkeypatch):
    def refuse(batch):
        raise RuntimeError("no kernels for this shape\nsecond line")
    view = graphed.eager()
    view.graph = type(graphed.graph)(graphed.graph.stateful, graphed.graph.num_layers, graphed.graph.num_heads,
                                     graphed.graph.head_dim, graphed.graph.slots)
    monkeypatch.setattr(view.graph.stateful, "session", refuse)
    audio = view.encode(features(1), PROMPT)
    with pytest.warns(UserWarning, match="runs eagerly at batch 1: its graph does not compile") as caught:
        state = view.prefill(audio, 4)
    assert len(caught) == 1 and "\n" not in str(caught[0].message) and not isinstance(state.cache, GraphCache)
