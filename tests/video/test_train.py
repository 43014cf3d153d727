"""The training layout is the pipeline's: the logits after each question equal the streamed ones."""

import numpy as np
import torch

from mmaccel.video.data import VOCAB, make_stream, questions
from mmaccel.video.qwen_vl import QwenVLStream
from mmaccel.video.stream import VideoStreamPipeline
from mmaccel.video.train import TRAIN_KINDS, build_model, layout, loss_of
from mmaccel.video.words import WordTokenizer


def test_training_sequences_are_laid_out_as_the_pipeline_streams_them():
    tok = WordTokenizer(VOCAB)
    hf = build_model(tok).eval()
    model = QwenVLStream(hf)
    stream = make_stream(3, 40, "train")
    qs = questions(stream, np.random.default_rng(0), 3, kinds=TRAIN_KINDS)[:2]
    ids, labels, pixels, grids = layout(stream, qs, tok, model.patchify)
    with torch.no_grad():
        ref = hf(input_ids=ids[None], mm_token_type_ids=(ids[None] == tok.video).int() * 2, pixel_values_videos=pixels,
                 video_grid_thw=grids).logits[0]
    at = (ids == tok.answer).nonzero()[:, 0].tolist()             # each question's last token
    pipe = VideoStreamPipeline(model, tok)
    for i, q in enumerate(qs):
        for t in range(pipe.frames_seen, q.frame + 1):
            pipe.feed(stream.frame(t))
        pipe._flush()
        got = model.append_text(pipe.state, tok.question_ids(q.text))
        assert (got[0] - ref[at[i]]).abs().max() < 1e-4
        model.append_text(pipe.state, tok.answer_ids(q.answer))     # teacher forcing, as in training
    assert (labels != -100).sum() == sum(len(tok.answer_ids(q.answer)) for q in qs)
    assert torch.isfinite(loss_of(hf, (ids, labels, pixels, grids), "cpu"))
