"""Ingest-time token reduction: what each reducer keeps, the keep-ratio budget, and the pipeline with it."""

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.video.qwen_vl import QwenVLStream
from mmaccel.video.reduce import Segment, SpatialMerge, TemporalDrop, as_reducers
from mmaccel.video.stream import VideoStreamPipeline
from tests.video.conftest import tiny_qwen_vl
from tests.video.test_stream import Digits


def frames(background, boxes=(), t=2, side=56):
    """uint8 [t, side, side, 3]: a fixed background with bright 28x28 cells at (row, col) token cells."""
    x = background.clone()
    for r, c in boxes:
        x[r * 28:(r + 1) * 28, c * 28:(c + 1) * 28] = 250
    return x[None].expand(t, -1, -1, -1).clone()


@pytest.fixture
def background():
    return torch.randint(0, 20, (56, 56, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def segment(x, embeds=None):
    return Segment(x, torch.randn(4, 8) if embeds is None else embeds, (2, 2))


def test_temporal_drop_keeps_the_first_segment_then_only_changed_regions(background):
    drop = TemporalDrop("pixel")
    assert drop(segment(frames(background))).keep.tolist() == [True] * 4        # nothing to compare with
    assert drop(segment(frames(background))).keep.tolist() == [False] * 4       # static: all dropped
    assert drop(segment(frames(background, [(1, 0)]))).keep.tolist() == [False, False, True, False]
    assert drop(segment(frames(background, [(1, 0)]))).keep.tolist() == [False] * 4
    drop.reset()
    assert drop(segment(frames(background))).keep.all()


def test_temporal_drop_budget_keeps_the_most_changed(background):
    drop = TemporalDrop("pixel", keep_ratio=0.25)
    drop(segment(frames(background)))
    x = frames(background, [(0, 0), (1, 1)])
    x[:, 28:, 28:] = 120                                    # a smaller change at (1, 1) than the white cell at (0, 0)
    assert drop(segment(x)).keep.tolist() == [True, False, False, False]


def test_temporal_drop_on_features_uses_cosine_change(background):
    drop = TemporalDrop("feature", threshold=0.05)
    e = torch.randn(4, 8)
    drop(segment(frames(background), e))
    moved = e.clone()
    moved[2] = -moved[2]
    assert drop(segment(frames(background), moved)).keep.tolist() == [False, False, True, False]


def test_spatial_merge_merges_similar_neighbours_into_their_mean():
    e = torch.tensor([[1.0, 0], [1.0, 0.1], [0, 1.0], [-1.0, 0]])
    out = SpatialMerge(threshold=0.9)(Segment(torch.zeros(1, 56, 56, 3, dtype=torch.uint8), e.clone(), (2, 2)))
    assert out.keep.tolist() == [True, False, True, True]        # 0 and 1 (row neighbours) merged at 0's position
    assert torch.allclose(out.embeds[0], e[:2].mean(0))
    budget = SpatialMerge(threshold=1.0, keep_ratio=0.5)(Segment(torch.zeros(1, 56, 56, 3, dtype=torch.uint8), e, (2, 2)))
    assert int(budget.keep.sum()) == 2                          # merged on past the threshold, down to the budget


def test_spatial_merge_only_merges_survivors():
    e = torch.ones(4, 3)
    seg = Segment(torch.zeros(1, 56, 56, 3, dtype=torch.uint8), e, (2, 2), keep=torch.tensor([True, False, False, True]))
    out = SpatialMerge(threshold=0.5)(seg)
    assert out.keep.tolist() == [True, False, False, True]       # 0 and 3 are not neighbours


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, "half"])
def test_keep_ratio_outside_the_unit_interval_is_an_error(bad):
    with pytest.raises(InputError, match="keep_ratio"):
        TemporalDrop(keep_ratio=bad)
    with pytest.raises(InputError, match="keep_ratio"):
        SpatialMerge(keep_ratio=bad)


def test_bad_reducer_arguments_are_errors():
    with pytest.raises(InputError, match="metric"):
        TemporalDrop("optical-flow")
    with pytest.raises(InputError, match="threshold"):
        TemporalDrop(threshold=-1)
    with pytest.raises(InputError, match="reduction"):
        as_reducers(["dtd"])


def test_pipeline_reports_kept_tokens_and_answers_losslessly_over_the_reduced_stream(background):
    model = QwenVLStream(tiny_qwen_vl())
    full = VideoStreamPipeline(model, Digits())
    reduced = VideoStreamPipeline(model, Digits(), reduction=[TemporalDrop("pixel"), SpatialMerge(0.99)],
                                  draft=model, draft_keep=0.1)         # segments with no survivors reach the draft
    reports = []
    for t in range(12):
        f = frames(background, [(t // 4 % 2, 0)], t=1)[0]
        full.feed(f)
        reports.append(reduced.feed(f))
    appended = [r for r in reports if r.appended]
    assert [r.tokens_in for r in appended] == [4] * 6
    assert appended[0].vision_tokens >= 1 and sum(r.vision_tokens for r in appended[1:]) < 4 * 5
    assert reduced.kv_entries < full.kv_entries
    ar = reduced.ask("3 4", max_new_tokens=4)
    reduced.reset()
    for t in range(12):
        reduced.feed(frames(background, [(t // 4 % 2, 0)], t=1)[0])
    assert reduced.ask("3 4", "ngram", max_new_tokens=4).tokens == ar.tokens
    assert any(r.appended and r.vision_tokens == 0 for r in reports)
