"""The streaming pipeline: answers equal generation over the whole sequence, lossless methods equal greedy,
memory stays bounded with positions in range, and bad input is a clear error."""

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.video.memory import KVBudget
from mmaccel.video.qwen_vl import QwenVLStream
from mmaccel.video.stream import VideoStreamPipeline
from tests.video.conftest import VE, VIDEO, VS, tiny_qwen_vl


class Digits:
    """Question "3 4 5" -> ids [1, 3, 4, 5, 2]; answers decode to their ids."""

    eos_token_id = 0

    def question_ids(self, text):
        return [1] + [int(w) for w in text.split()] + [2]

    def decode(self, ids):
        return " ".join(map(str, ids))


def clip(n, seed, h=56, w=56):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, h, w, 3), dtype=torch.uint8, generator=g)


@pytest.fixture(scope="module")
def hf():
    return tiny_qwen_vl()


def reference(hf, model, pieces, max_new_tokens):
    """HF generate() over the whole sequence: pieces are token lists or frame pairs."""
    ids, pixels, grids = [], [], []
    for piece in pieces:
        if isinstance(piece, torch.Tensor):
            p, grid = model.patchify(piece)
            pixels.append(p)
            grids.append(grid)
            ids += [VS] + [VIDEO] * (grid[0] * grid[1] * grid[2] // 4) + [VE]
        else:
            ids += piece
    x = torch.tensor([ids])
    out = hf.generate(input_ids=x, mm_token_type_ids=(x == VIDEO).int() * 2, pixel_values_videos=torch.cat(pixels),
                      video_grid_thw=torch.tensor(grids), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, x.shape[1]:].tolist()


def test_answers_equal_generation_over_the_whole_sequence_across_turns(hf):
    model = QwenVLStream(hf)
    pipe = VideoStreamPipeline(model, Digits(), system_prompt=[5, 6, 7])
    a, b = clip(4, 1), clip(2, 2)
    for f in a:
        pipe.feed(f)
    first = pipe.ask("11 12", max_new_tokens=5)
    for f in b:
        pipe.feed(f)
    second = pipe.ask("13", max_new_tokens=5)
    q1, q2 = Digits().question_ids("11 12"), Digits().question_ids("13")
    assert first.tokens == reference(hf, model, [[5, 6, 7], a[:2], a[2:], q1], 5)
    assert second.tokens == reference(hf, model, [[5, 6, 7], a[:2], a[2:], q1, first.tokens, b, q2], 5)
    assert first.stats.nfe >= 1 and first.frames_seen == 4


@pytest.mark.parametrize("method,params", [("ngram", {"k": 3}), ("sjd", {"window": 4}), ("sjd-coupled", {"window": 4})])
def test_lossless_methods_answer_like_greedy(hf, method, params):
    answers = {}
    for name, kw in (("ar", {}), (method, params)):
        pipe = VideoStreamPipeline(QwenVLStream(hf), Digits(), system_prompt=[5, 6])
        for f in clip(4, 3):
            pipe.feed(f)
        answers[name] = [pipe.ask("11 12", name, max_new_tokens=12, **kw).tokens,
                         pipe.ask("9", name, max_new_tokens=8, **kw).tokens]
    assert answers[method] == answers["ar"]


def test_memory_is_bounded_and_positions_stay_in_range(hf):
    budget = KVBudget(sink=4, vision=3 * 6, text=16)            # three segments of 4 tokens + 2 marks
    pipe = VideoStreamPipeline(QwenVLStream(hf), Digits(), budget=budget, max_answer_tokens=4, system_prompt=[5, 6, 7])
    peak = 0
    for i, f in enumerate(clip(60, 4)):
        report = pipe.feed(f)
        peak = max(peak, report.kv_entries)
        if i % 20 == 19:
            pipe.ask("11", max_new_tokens=3)
            peak = max(peak, pipe.kv_entries)
    assert peak <= budget.total + 4 + 64 and pipe.kv_entries <= budget.total
    assert pipe.state.extras["next_position"] <= budget.total + 3 * 4     # a segment spans 4 positions for 6 entries
    assert pipe.state.cache.capacity == budget.total + 4 + 64


def test_eviction_goes_in_chunks(hf):
    """A full window is cut by a chunk of its size at once: the next appends evict nothing, and the cache
    never outgrows its budget; chunk=0 evicts by just enough on every append."""
    evictions = {}
    for chunk in (0.0, 0.5):
        budget = KVBudget(sink=3, vision=4 * 6, text=8, chunk=chunk)       # four segments of 4 tokens + 2 marks
        pipe = VideoStreamPipeline(QwenVLStream(hf), Digits(), budget=budget, system_prompt=[5, 6, 7])
        sizes = [pipe.feed(f).kv_entries for f in clip(24, 6)][1::2]     # after each appended segment
        assert max(sizes) <= budget.total
        evictions[chunk] = sum(b <= a for a, b in zip(sizes, sizes[1:]))
        if chunk:
            assert min(sizes[4:]) == 3 + 2 * 6                           # cut to half the window, then refilled
    assert evictions[0.0] == 8 and evictions[0.5] == 3
    with pytest.raises(InputError, match="chunk"):
        KVBudget(chunk=1.0)


def test_evicted_keys_are_rotated_to_their_new_positions(hf):
    """Layer-0 keys depend on a token and its position only: after eviction the moved keys equal those of a
    fresh stream that holds the surviving units at their new, contiguous positions."""
    model = QwenVLStream(hf)
    frames = clip(8, 5)
    budget = KVBudget(sink=3, vision=2 * 6, text=8, chunk=0.0)
    pipe = VideoStreamPipeline(model, Digits(), budget=budget, system_prompt=[5, 6, 7])
    for f in frames:
        pipe.feed(f)                                              # 4 segments: the first two are evicted
    fresh = VideoStreamPipeline(model, Digits(), system_prompt=[5, 6, 7])
    for f in frames[4:]:
        fresh.feed(f)
    n = pipe.kv_entries
    assert n == fresh.kv_entries == 3 + 12
    assert torch.allclose(pipe.state.cache.k[0][:, :, :n], fresh.state.cache.k[0][:, :, :n], atol=1e-5)
    assert torch.equal(pipe.state.cache.v[0][:, :, :n], fresh.state.cache.v[0][:, :, :n])
    assert pipe.state.extras["next_position"] == fresh.state.extras["next_position"]


def test_bad_input_is_a_clear_error(hf):
    pipe = VideoStreamPipeline(QwenVLStream(hf), Digits())
    with pytest.raises(InputError, match="no frame has been fed"):
        pipe.ask("3")
    with pytest.raises(InputError, match="multiples of 28"):
        pipe.feed(clip(1, 0, h=50)[0])
    pipe.feed(clip(1, 0)[0])
    with pytest.raises(InputError, match="the stream's frames are 56x56"):
        pipe.feed(clip(1, 0, w=84)[0])
    with pytest.raises(InputError, match="uint8"):
        pipe.feed(torch.zeros(56, 56, 3))
    with pytest.raises(InputError, match="max_new_tokens"):
        pipe.ask("3", max_new_tokens=1000)
    with pytest.raises(InputError, match="unknown method"):
        pipe.ask("3", "fastest")
    with pytest.raises(InputError, match="KV budget"):
        KVBudget(vision=0)
    small = VideoStreamPipeline(QwenVLStream(hf), Digits(), budget=KVBudget(sink=0, vision=5, text=8))
    with pytest.raises(InputError, match="more than the KV budget keeps"):
        small.feed(clip(2, 0)[0])
        small.feed(clip(2, 0)[1])


def test_a_local_directory_loads_with_its_word_vocabulary_or_hf_tokenizer(tmp_path):
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from mmaccel.errors import ModelNotFoundError
    from mmaccel.video.train import build_model
    from mmaccel.video.words import WordTokenizer

    words = ["bag", "shirt", "what", "?"]
    build_model(WordTokenizer(words)).save_pretrained(tmp_path / "words")
    (tmp_path / "words" / "words.json").write_text(json.dumps(words))
    pipe = VideoStreamPipeline.from_pretrained(str(tmp_path / "words"), max_answer_tokens=4)
    pipe.feed(clip(1, 0)[0])
    assert pipe.ask("what ?", max_new_tokens=3).frames_seen == 1
    with pytest.raises(InputError, match="unknown word"):
        pipe.ask("why ?", max_new_tokens=2)

    (tmp_path / "words" / "words.json").write_text(json.dumps(words[:2]))
    with pytest.raises(InputError, match="does not match the model"):
        VideoStreamPipeline.from_pretrained(str(tmp_path / "words"))
    hf = tiny_qwen_vl(seed=1)
    hf.save_pretrained(tmp_path / "chat")
    vocab = {w: i for i, w in enumerate(["<unk>", "<|im_end|>", "<|im_start|>", "user", "assistant", "what", "?", "\n"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>").save_pretrained(tmp_path / "chat")
    chat = VideoStreamPipeline.from_pretrained(str(tmp_path / "chat"))
    assert chat.tokenizer.eos_token_id == 1 and chat.tokenizer.question_ids("what ?")[:2] == [5, 6]

    with pytest.raises(ModelNotFoundError, match="no model directory"):
        VideoStreamPipeline.from_pretrained(str(tmp_path / "missing"))
    with pytest.raises(ModelNotFoundError, match="unknown built-in"):
        VideoStreamPipeline.from_pretrained("builtin:other")
    (tmp_path / "bad").mkdir()
    with pytest.raises(InputError, match="no config.json"):
        VideoStreamPipeline.from_pretrained(str(tmp_path / "bad"))


def test_watch_feeds_a_source_frame_by_frame(hf):
    pipe = VideoStreamPipeline(QwenVLStream(hf), Digits())
    reports = list(pipe.watch(clip(30, 6).numpy(), source_fps=30, fps=10))
    assert [r.index for r in reports] == list(range(10)) and [r.appended for r in reports[:2]] == [False, True]
    assert reports[-1].kv_entries == 5 * (4 + 2)


@pytest.mark.parametrize("draft_keep", [0.0, 0.1, 1.0])
def test_speculative_answers_with_a_reduced_vision_draft_equal_greedy(hf, draft_keep):
    """SpecVLM: the draft sees draft_keep of each segment's vision tokens (none: text only); the full model
    verifies, so greedy answers are the target's, turn after turn, under eviction too."""
    model = QwenVLStream(hf)
    budget = KVBudget(sink=4, vision=24, text=24)
    plain = VideoStreamPipeline(model, Digits(), budget=budget)
    spec = VideoStreamPipeline(model, Digits(), budget=budget, draft=model, draft_keep=draft_keep)
    other = VideoStreamPipeline(model, Digits(), budget=budget, draft=QwenVLStream(tiny_qwen_vl(seed=1)),
                                draft_keep=draft_keep)
    for turn in range(3):
        for f in clip(6, 10 + turn):
            for pipe in (plain, spec, other):
                pipe.feed(f)
        want = plain.ask("4 5 6", max_new_tokens=6)
        got = spec.ask("4 5 6", "speculative", k=3, max_new_tokens=6)
        assert got.tokens == want.tokens and got.stats.draft_passes > 0
        if draft_keep == 1.0 and len(want.tokens) > 2:          # the draft sees what the target sees: all accepted
            assert got.stats.nfe < want.stats.nfe
        assert other.ask("4 5 6", "tree", depth=3, width=2, max_new_tokens=6).tokens == want.tokens
        assert spec.kv_entries == plain.kv_entries
        assert spec.draft_state.cache.lengths[0] <= budget.total          # the draft's cache is bounded too


def test_early_exit_logits_equal_the_truncated_hugging_face_model(hf):
    """`early_exit(k)`: the first k layers, then the final norm and head, over its own k-layer cache."""
    model = QwenVLStream(hf)
    draft = model.early_exit(1)
    state = draft.new_state(1, 16)
    ids = [1, 4, 5, 6, 2]
    got = draft.append_text(state, ids)
    lm = hf.model.language_model
    positions = torch.arange(len(ids))[None, None].expand(3, 1, -1)
    hidden = lm(input_ids=torch.tensor([ids]), position_ids=positions, output_hidden_states=True).hidden_states[1]
    want = hf.lm_head(lm.norm(hidden))[0, -1]
    assert len(state.cache.k) == 1 and model.num_layers == 2
    torch.testing.assert_close(got[0], want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got[0], model.append_text(model.new_state(1, 16), ids)[0], atol=1e-3)


def test_speculative_answers_with_an_early_exit_draft_equal_greedy(hf):
    """LayerSkip-style self-speculation: the model's first layer drafts from its own vision embeddings
    (no second encoder pass), the whole model verifies: greedy answers are the target's, under eviction."""
    model = QwenVLStream(hf)
    budget = KVBudget(sink=4, vision=24, text=24)
    plain = VideoStreamPipeline(model, Digits(), budget=budget)
    spec = VideoStreamPipeline(model, Digits(), budget=budget, draft=model.early_exit(1), draft_keep=1.0)
    for turn in range(3):
        for f in clip(6, 20 + turn):
            plain.feed(f)
            spec.feed(f)
        want = plain.ask("4 5 6", max_new_tokens=6)
        got = spec.ask("4 5 6", "speculative", k=3, max_new_tokens=6)
        assert got.tokens == want.tokens and got.stats.draft_passes > 0
        assert spec.draft_state.cache.lengths[0] == spec.kv_entries      # it saw every entry the target has
        again = spec.ask("4 5", "early-exit", exit_layer=1, k=2, max_new_tokens=6)    # the core's name for it
        assert again.tokens == plain.ask("4 5", max_new_tokens=6).tokens and again.stats.draft_passes > 0
    with pytest.raises(InputError, match="draft=model.early_exit"):
        spec.ask("4 5", "early-exit", exit_layer=2, max_new_tokens=4)
    with pytest.raises(InputError, match="draft=model.early_exit"):
        plain.ask("4 5", "early-exit", exit_layer=1, max_new_tokens=4)


@pytest.mark.parametrize("layers", [0, 2, 1.5])
def test_early_exit_outside_the_model_is_an_error(hf, layers):
    with pytest.raises(InputError, match="early exit"):
        QwenVLStream(hf).early_exit(layers)


def test_draft_keep_outside_the_unit_interval_is_an_error(hf):
    with pytest.raises(InputError, match="draft_keep"):
        VideoStreamPipeline(QwenVLStream(hf), Digits(), draft_keep=1.5)


def test_answer_methods_come_from_the_video_registry(hf):
    """`ask` dispatches through `VideoStreamPipeline.methods()`: the core methods a stream can run, a draft-drafted
    one refused in one line when the pipeline has no draft, the Medusa ones not offered (no streaming heads)."""
    from mmaccel.video.methods import VIDEO_REGISTRY

    assert VideoStreamPipeline.methods() is VIDEO_REGISTRY and "medusa" not in VIDEO_REGISTRY
    assert {name for name, p in VIDEO_REGISTRY.items() if "draft" in p.needs} == {"speculative", "tree", "early-exit"}
    pipe = VideoStreamPipeline(QwenVLStream(hf), Digits())
    pipe.feed(clip(1, 0)[0])
    with pytest.raises(InputError, match="unknown method 'medusa'; choose from ar, speculative"):
        pipe.ask("3", "medusa")
    with pytest.raises(InputError, match="method 'tree' drafts with a draft that has watched the stream") as err:
        pipe.ask("3", "tree", depth=2)
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match=r"k must be an integer in \[1, 64\], got 0"):
        pipe.ask("3", "ngram", k=0)
