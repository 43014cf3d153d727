"""The training layout is the pipeline's: the logits after each question equal the streamed ones."""

import numpy as np
import pytest
import torch

from mmaccel.video.data import VOCAB, make_stream, questions
from mmaccel.video.qwen_vl import QwenVLStream
from mmaccel.video.reduce import TemporalDrop
from mmaccel.video.stream import VideoStreamPipeline
from mmaccel.video.train import TRAIN_KINDS, build_model, grow_vocabulary, layout, loss_of
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


def test_early_exit_losses_add_to_the_last_layers_loss():
    tok = WordTokenizer(VOCAB)
    hf = build_model(tok).eval()
    stream = make_stream(4, 30, "train")
    batch = layout(stream, questions(stream, np.random.default_rng(1), 2, kinds=TRAIN_KINDS), tok,
                   QwenVLStream(hf).patchify)
    with torch.no_grad():
        last = loss_of(hf, batch, "cpu", exits=())
        both = loss_of(hf, batch, "cpu", exits=(1, 2), exit_weight=0.5)
        one = loss_of(hf, batch, "cpu", exits=(1,), exit_weight=0.5)
    assert last < one < both                       # each exit adds its own (positive) cross-entropy


def test_a_checkpoint_of_a_smaller_vocabulary_resumes_with_its_words_in_place():
    tok = WordTokenizer(VOCAB)
    small, model = build_model(WordTokenizer(VOCAB[:-3]), seed=1), build_model(tok)
    opt = torch.optim.AdamW(small.parameters())
    small(input_ids=torch.tensor([[1, 9, 10, 2]])).logits.sum().backward()
    opt.step()
    state = {"model": small.state_dict(), "opt": opt.state_dict()}
    old = state["model"]["model.language_model.embed_tokens.weight"].clone()
    grow_vocabulary(state, model)
    model.load_state_dict(state["model"])
    grown = torch.optim.AdamW(model.parameters())
    grown.load_state_dict(state["opt"])
    table = model.model.language_model.embed_tokens.weight
    assert table.shape[0] == len(tok) == old.shape[0] + 3 and torch.equal(table[:old.shape[0]], old)
    assert model.lm_head.weight is table                          # still tied
    moments = [s["exp_avg"] for s in grown.state.values() if s["exp_avg"].shape == table.shape]
    assert len(moments) == 1 and not moments[0][-3:].any()
