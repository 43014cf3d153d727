"""The training layout is the pipeline's: the logits after each question equal the streamed ones."""

import numpy as np
import pytest
import torch

from mmaccel.video.data import VOCAB, make_stream, questions
from mmaccel.video.qwen_vl import QwenVLStream
from mmaccel.video.reduce import TemporalDrop
from mmaccel.video.stream import VideoStreamPipeline
from mmaccel.video.train import TRAIN_KINDS, build_model, layout, loss_of
from mmaccel.video.words import WordTokenizer


@pytest.mark.parametrize("keep_ratio", [None, 1.0, 0.25])
def test_training_sequences_are_laid_out_as_the_pipeline_streams_them(keep_ratio):
    tok = WordTokenizer(VOCAB)
    hf = build_model(tok).eval()
    model = QwenVLStream(hf)
    stream = make_stream(3, 40, "train")
    qs = questions(stream, np.random.default_rng(0), 3, kinds=TRAIN_KINDS)[:2]
    drop = lambda: None if keep_ratio is None else TemporalDrop("pixel", keep_ratio=keep_ratio)   # noqa: E731
    batch = layout(stream, qs, tok, model.patchify, drop=drop())
    ids, labels, pixels, grids, keep = batch
    assert bool(keep.all()) == (keep_ratio is None)            # the static background always drops
    with torch.no_grad():
        ref = hf(input_ids=ids[None], mm_token_type_ids=(ids[None] == tok.video).int() * 2, pixel_values_videos=pixels,
                 video_grid_thw=grids).logits[0]
        if not keep.all():      # the reduced sequence through the training loss's path, checked below instead
            ref = None
    at = (ids == tok.answer).nonzero()[:, 0].tolist()             # each question's last token
    pipe = VideoStreamPipeline(model, tok, reduction=drop())
    for i, q in enumerate(qs):
        for t in range(pipe.frames_seen, q.frame + 1):
            pipe.feed(stream.frame(t))
        pipe._flush()
        got = model.append_text(pipe.state, tok.question_ids(q.text))
        if ref is None:
            ref = _reduced_logits(hf, batch)
        assert (got[0] - ref[at[i]]).abs().max() < 1e-4
        model.append_text(pipe.state, tok.answer_ids(q.answer))     # teacher forcing, as in training
    assert (labels != -100).sum() == sum(len(tok.answer_ids(q.answer)) for q in qs)
    assert torch.isfinite(loss_of(hf, batch, "cpu"))


def _reduced_logits(hf, batch):
    """Logits [L, V] over the full sequence with the dropped vision tokens' rows filled by NaN: the
    reduced sequence run as `loss_of` runs it (embeddings, then the survivors at their positions)."""
    ids, labels, pixels, grids, keep = batch
    captured = {}
    original = hf.forward

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        captured["logits"] = out.logits[0]
        return out

    hf.forward = spy
    try:
        loss_of(hf, batch, "cpu")
    finally:
        hf.forward = original
    full = torch.full((ids.shape[0], captured["logits"].shape[-1]), float("nan"))
    full[keep] = captured["logits"].detach()
    return full
