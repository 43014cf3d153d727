"""Streaming appends equal one prefill of the whole sequence; the processor's patch layout; errors."""

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.video.qwen_vl import QwenVLStream
from tests.video.conftest import VE, VIDEO, VS, tiny_qwen_vl


def frames(n: int, h: int = 56, w: int = 84, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, h, w, 3), dtype=torch.uint8, generator=g)


def test_patchify_is_the_processors_layout():
    from transformers import Qwen2VLVideoProcessor

    model = QwenVLStream(tiny_qwen_vl())
    clip = frames(2)
    ours, grid = model.patchify(clip)
    proc = Qwen2VLVideoProcessor(do_resize=False)
    ref = proc(videos=[clip.numpy()], return_tensors="pt")
    assert grid == tuple(ref["video_grid_thw"][0].tolist())
    assert torch.allclose(ours, ref["pixel_values_videos"], atol=1e-5)


def test_streamed_chunks_equal_one_prefill(qwen_vl):
    """prompt, two vision segments, a question: appended piece by piece with our positions, the logits
    of every piece equal those of one forward over the whole sequence with HF's own M-RoPE ids."""
    model = QwenVLStream(qwen_vl)
    prompt, question = [5, 6, 7], [11, 12, 13, 14]
    chunks = [frames(2, seed=1), frames(2, seed=2), frames(1, seed=3)]
    state = model.new_state(1, 128)
    out = [model.append_text(state, prompt)]
    for c in chunks:
        out.append(model.append_frames(state, c))
    out.append(model.append_text(state, question))

    pixels, grids, ids = [], [], list(prompt)
    ends = [len(ids) - 1]
    for c in chunks:
        p, grid = model.patchify(c)
        pixels.append(p)
        grids.append(grid)
        ids += [VS] + [VIDEO] * (grid[0] * grid[1] * grid[2] // 4) + [VE]
        ends.append(len(ids) - 1)
    ids += question
    ends.append(len(ids) - 1)
    input_ids = torch.tensor([ids])
    types = (input_ids == VIDEO).int() * 2
    with torch.no_grad():
        ref = qwen_vl(input_ids=input_ids, mm_token_type_ids=types, pixel_values_videos=torch.cat(pixels),
                      video_grid_thw=torch.tensor(grids)).logits[0]
    for got, at in zip(out, ends):
        assert (got[0] - ref[at]).abs().max() < 1e-4, at
    assert state.extras["next_position"] == int(qwen_vl.model.rope_deltas[0]) + len(ids)


def test_text_steps_continue_at_the_models_positions(qwen_vl):
    """Greedy answer tokens decoded with `step` after the stream equal HF generate() on the whole sequence."""
    model = QwenVLStream(qwen_vl)
    state = model.new_state(1, 128)
    model.append_text(state, [5, 6])
    model.append_frames(state, frames(2, seed=4))
    logits = model.append_text(state, [11, 12])
    ours = []
    for _ in range(6):
        tok = int(logits[0].argmax())
        ours.append(tok)
        logits = model.step(state, torch.tensor([[tok]]))[:, -1]

    p, grid = model.patchify(frames(2, seed=4))
    ids = torch.tensor([[5, 6, VS] + [VIDEO] * (grid[1] * grid[2] // 4) + [VE, 11, 12]])
    ref = qwen_vl.generate(input_ids=ids, mm_token_type_ids=(ids == VIDEO).int() * 2, pixel_values_videos=p,
                           video_grid_thw=torch.tensor([grid]), max_new_tokens=6, do_sample=False)
    assert ours == ref[0, ids.shape[1]:].tolist()


def test_bad_frames_are_clear_errors(qwen_vl):
    model = QwenVLStream(qwen_vl)
    with pytest.raises(InputError, match="multiples of 28"):
        model.patchify(frames(2, h=50))
    with pytest.raises(InputError, match=r"\[T, H, W, 3\]"):
        model.patchify(torch.zeros(56, 56, 3, dtype=torch.uint8))
    with pytest.raises(InputError, match="not a supported streaming VLM"):
        from tests.conftest import tiny_llama
        QwenVLStream(tiny_llama(0))
