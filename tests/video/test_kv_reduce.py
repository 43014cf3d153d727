"""KV-side vision token reduction: dropped entries leave the survivors exact, QuestionPrune keeps the tokens
the question attends to most (scores checked against HF's eager attention), RoundDecay halves old rounds
and spares the newest, a long stream stays in budget and decodes losslessly, bad input is a clear error."""

import math

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.video.kv_reduce import Question, QuestionPrune, RoundDecay, capture_attention_inputs, key_norms, vision_tokens
from mmaccel.video.memory import KVBudget, evict, evict_entries, segment_runs
from mmaccel.video.qwen_vl import QwenVLStream
from mmaccel.video.reduce import TemporalDrop
from mmaccel.video.stream import VideoStreamPipeline
from tests.video.conftest import VE, VIDEO, VS, tiny_qwen_vl
from tests.video.test_stream import Digits, clip

PROMPT, QUESTION = [5, 6, 7], [11, 12]


@pytest.fixture(scope="module")
def hf():
    return tiny_qwen_vl()


def stream(model, segments, keeps=None):
    """prompt, the frame pairs `segments` (each reduced by its `keeps` mask at append), the question."""
    state = model.new_state(1, 96)
    model.append_text(state, PROMPT)
    for i, frames in enumerate(segments):
        embeds, grid = model.encode(frames)
        positions, nxt = model.segment_positions(state.extras["next_position"], grid)
        model.append_segment(state, embeds, positions, nxt, keep=None if keeps is None else keeps[i])
    model.append_text(state, QUESTION)
    return state


def test_dropped_entries_leave_the_survivors_exact():
    """With one decoder layer a cache entry's K/V depend on its token and position only, so after dropping
    vision entries the logits of a new token equal those of a stream that never had them (`append_segment(
    keep=...)`); a later unit-level eviction of a reduced segment stays exact too."""
    model = QwenVLStream(tiny_qwen_vl(num_layers=1))
    a, b = clip(2, 1), clip(2, 2)
    masks = [torch.tensor([True, False, True, False]), torch.tensor([False, False, False, True])]
    state = stream(model, [a, b])
    keep = [True] * 3 + [True, *masks[0].tolist(), True] + [True, *masks[1].tolist(), True] + [True] * 2
    assert evict_entries(state, state.extras["units"], keep) == 5
    model.move_to(state, state.extras["next_position"])
    fresh = stream(model, [a, b], masks)
    n = int(fresh.cache.lengths[0])
    assert int(state.cache.lengths[0]) == n == len(state.extras["units"].entry_unit) == 3 + 4 + 3 + 2
    assert torch.allclose(state.cache.k[0][:, :, :n], fresh.cache.k[0][:, :, :n], atol=1e-6)     # other GEMM shapes
    assert torch.allclose(state.cache.v[0][:, :, :n], fresh.cache.v[0][:, :, :n], atol=1e-6)
    assert state.extras["next_position"] == fresh.extras["next_position"]
    token = torch.tensor([[13]])
    assert torch.allclose(model.step(state, token)[:, -1], model.step(fresh, token)[:, -1], atol=1e-5)
    state.cache.rollback(1)

    # evict segment a whole: b and the question move down and their keys rotate
    units = state.extras["units"]
    position = evict(state, units, [u != units.entry_unit[3] for u in range(len(units.kind))], model.rotate_keys)
    model.move_to(state, position)
    fresh = stream(model, [b], masks[1:])
    assert position == fresh.extras["next_position"] and int(state.cache.lengths[0]) == int(fresh.cache.lengths[0])
    assert torch.allclose(model.step(state, token)[:, -1], model.step(fresh, token)[:, -1], atol=1e-5)


def test_deeper_layers_keep_the_survivors_entries_as_they_were(hf):
    """With more layers a survivor's deeper K/V saw the dropped tokens when it was appended: dropping keeps
    them as they were (plain copies, every layer), and layer 0 equals the never-had-them stream's."""
    model = QwenVLStream(hf)
    a = clip(2, 3)
    state = stream(model, [a])
    before = [(k.clone(), v.clone()) for k, v in zip(state.cache.k, state.cache.v)]
    keep = [True] * 3 + [True, True, False, True, False, True] + [True] * 2
    evict_entries(state, state.extras["units"], keep)
    index = [i for i, k in enumerate(keep) if k]
    n = len(index)
    for (k0, v0), k, v in zip(before, state.cache.k, state.cache.v):
        assert torch.equal(k[:, :, :n], k0[:, :, index]) and torch.equal(v[:, :, :n], v0[:, :, index])
    fresh = stream(model, [a], [torch.tensor([True, False, True, False])])
    assert torch.allclose(state.cache.k[0][:, :, :n], fresh.cache.k[0][:, :, :n], atol=1e-6)
    with pytest.raises(InputError, match="only vision tokens"):
        evict_entries(state, state.extras["units"], [True] * 3 + [False] + [True] * 5)       # <vision_start>
    with pytest.raises(InputError, match="only vision tokens"):
        evict_entries(state, state.extras["units"], [False] + [True] * 8)                    # text


def hf_question_attention(hf, model, segments, layer):
    """HF's own eager attention over the whole sequence (its own M-RoPE ids, `hf` set to eager): the weights
    the question's tokens give every position at `layer`, mean over heads and question tokens."""
    ids, pixels, grids = list(PROMPT), [], []
    for frames in segments:
        p, grid = model.patchify(frames)
        pixels.append(p)
        grids.append(grid)
        ids += [VS] + [VIDEO] * (grid[0] * grid[1] * grid[2] // 4) + [VE]
    ids += QUESTION
    x = torch.tensor([ids])
    with torch.no_grad():
        out = hf(input_ids=x, mm_token_type_ids=(x == VIDEO).int() * 2, pixel_values_videos=torch.cat(pixels),
                 video_grid_thw=torch.tensor(grids), output_attentions=True)
    return out.attentions[layer][0, :, -len(QUESTION):].mean((0, 1))


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen2_vl"])
def test_question_prune_keeps_the_tokens_the_question_attends_to_most(kind):
    hf, eager = tiny_qwen_vl(kind), tiny_qwen_vl(kind)
    eager.load_state_dict(hf.state_dict())
    eager.set_attn_implementation("eager")          # output_attentions needs it; our stream runs sdpa
    model = QwenVLStream(hf)
    segments = [clip(2, 4), clip(2, 5), clip(2, 6)]
    state = model.new_state(1, 96)
    model.append_text(state, PROMPT)
    for frames in segments:
        model.append_frames(state, frames)
    with capture_attention_inputs(model, [0, 1]) as captured:
        logits = model.append_text(state, QUESTION)
    question = Question(model, state, len(QUESTION), captured)
    for layer in (0, 1):
        want = hf_question_attention(eager, model, segments, layer)
        assert torch.allclose(question.attention(layer), want, atol=1e-5), layer

    vision = torch.cat([entries for _, entries in question.segments()])                # 3 segments × 4 tokens
    top = vision[want[vision].topk(math.ceil(0.4 * 12)).indices].sort().values        # layer 1 = layer -1
    kept = sorted(set(range(len(want))) - set(vision.tolist()) | set(top.tolist()))
    before = state.cache.k[1][:, :, kept].clone()
    QuestionPrune(0.4)(question)
    assert int(state.cache.lengths[0]) == len(want) - (12 - 5) and vision_tokens(model, state) == 5
    assert torch.equal(state.cache.k[1][:, :, : len(kept)], before)
    assert int(state.extras["rope_offset"][0]) == state.extras["next_position"] - len(kept)
    assert torch.isfinite(logits).all()


def test_the_pipeline_reports_the_ratio_kept_and_answers_first_from_the_full_cache(hf):
    plain = VideoStreamPipeline(QwenVLStream(hf), Digits(), system_prompt=PROMPT)
    pruned = VideoStreamPipeline(QwenVLStream(hf), Digits(), system_prompt=PROMPT, kv_reduction=QuestionPrune(0.25))
    for f in clip(6, 7):
        plain.feed(f)
        pruned.feed(f)
    entries = pruned.kv_entries
    want, got = plain.ask("11 12", max_new_tokens=6), pruned.ask("11 12", max_new_tokens=6)
    assert (want.vision_entries_before, want.vision_entries_after) == (12, 12)
    assert (got.vision_entries_before, got.vision_entries_after) == (12, 3)
    assert got.tokens[0] == want.tokens[0]                          # the question's logits see every token
    assert pruned.kv_entries == entries + 4 + len(got.tokens) - (12 - 3)


def segment_sizes(pipe):
    """Vision tokens of each cached segment, oldest first."""
    return [stop - first - 2 for _, first, stop in segment_runs(pipe.state.extras["units"])]


def test_round_decay_shrinks_old_rounds_geometrically_and_spares_the_newest(hf):
    pipe = VideoStreamPipeline(QwenVLStream(hf), Digits(), system_prompt=PROMPT,
                               kv_reduction=RoundDecay(factor=0.5))
    sizes = []
    for turn in range(4):
        for f in clip(4, 20 + turn):
            pipe.feed(f)
        if turn == 2:       # rounds 0 and 1 decay: their survivors have the smallest key norms (no attention scores)
            norms = key_norms(pipe.state)
            old = [torch.arange(first + 1, stop - 1) for _, first, stop in segment_runs(pipe.state.extras["units"])[:4]]
            want = [pipe.state.cache.k[0][:, :, e[(-norms[e]).topk(math.ceil(len(e) / 2)).indices.sort().values]]
                    for e in old]
        newest = pipe.state.cache.k[0][:, :, pipe.kv_entries - 12: pipe.kv_entries].clone()
        answer = pipe.ask("11", max_new_tokens=2)
        sizes.append(segment_sizes(pipe))
        runs = segment_runs(pipe.state.extras["units"])
        first = runs[-2][1]
        assert torch.equal(pipe.state.cache.k[0][:, :, first: first + 12], newest)        # the newest round: as it was
        assert answer.vision_entries_before - answer.vision_entries_after == sum(      # all but the newest round
            s - math.ceil(s / 2) for s in (sizes[-2] if turn else []))
        if turn == 2:
            for (_, a, b), w in zip(runs[:4], want):
                assert torch.equal(pipe.state.cache.k[0][:, :, a + 1: b - 1], w)
    assert sizes == [[4, 4], [2, 2, 4, 4], [1, 1, 2, 2, 4, 4], [1, 1, 1, 1, 2, 2, 4, 4]]


def test_a_long_stream_with_both_reducers_stays_in_budget_and_decodes_losslessly(hf):
    """30 segments of 6 entries into a vision window of 60, a question every 6 segments: the freed budget keeps
    more segments than the window alone would (10), the cache never outgrows the budget, and n-gram
    speculation over the reduced cache answers exactly as greedy does."""
    budget = KVBudget(sink=4, vision=10 * 6, text=24, chunk=0.0)          # evict by just enough, every time
    answers, peaks = {}, {}
    for method, params in (("ar", {}), ("ngram", {"k": 3})):
        pipe = VideoStreamPipeline(QwenVLStream(hf), Digits(), budget=budget, max_answer_tokens=6, system_prompt=PROMPT,
                                   kv_reduction=[QuestionPrune(0.5), RoundDecay(0.5)])
        answers[method], peak = [], 0
        for i, f in enumerate(clip(60, 30)):
            peak = max(peak, pipe.feed(f).kv_entries)
            if i % 12 == 11:
                answer = pipe.ask("11 12", method, max_new_tokens=6, **params)
                answers[method].append((answer.tokens, answer.vision_entries_before, answer.vision_entries_after))
                peak = max(peak, pipe.kv_entries)
        peaks[method] = peak
        assert 10 < len(segment_sizes(pipe)) < 30                      # older segments were evicted whole
    assert answers["ngram"] == answers["ar"] and len(answers["ar"]) == 5
    assert all(len(tokens) == 6 for tokens, _, _ in answers["ar"])
    (_, before, after), *later = answers["ar"]
    assert after == before // 2                                         # the first question: QuestionPrune alone
    assert all(a <= math.ceil(b / 2) for _, b, a in later) and any(a < math.ceil(b / 2) for _, b, a in later)
    assert peaks["ar"] <= budget.total


def test_bad_input_is_a_clear_error(hf):
    for bad in (0, 1.5, -0.1, "half"):
        with pytest.raises(InputError, match="keep_ratio"):
            QuestionPrune(bad)
        with pytest.raises(InputError, match="factor"):
            RoundDecay(factor=bad)
    with pytest.raises(InputError, match="layer"):
        QuestionPrune(0.5, layer="last")
    with pytest.raises(InputError, match="min_tokens"):
        RoundDecay(min_tokens=0)
    model = QwenVLStream(hf)
    with pytest.raises(InputError, match="kv_reduction must be reducers"):
        VideoStreamPipeline(model, Digits(), kv_reduction=TemporalDrop())
    with pytest.raises(InputError, match="kv_reduction must be reducers"):
        VideoStreamPipeline(model, Digits(), kv_reduction=[QuestionPrune(0.5), "fast"])
    with pytest.raises(InputError, match="decoder layer 2"):
        VideoStreamPipeline(model, Digits(), kv_reduction=QuestionPrune(0.5, layer=2))
