"""KV cache: O(1) rollback, ragged rows, tree masks and compaction agree with a fresh prefill."""

import pytest
import torch

from mmaccel.core.model import KVCache, append_padded, append_ragged
from mmaccel.core.tree import TokenTree
from mmaccel.errors import InputError


def fresh_logits(model, seq):
    state = model.prefill([seq], room=32)
    return state.logits[0]


def test_rollback_then_reappend_equals_fresh_prefill(target):
    prompt, extra = [3, 14, 15, 92, 65], [35, 89, 79]
    state = target.prefill([prompt], room=32)
    target.step(state, torch.tensor([extra]))
    state.rollback(2)                               # keep prompt + 35
    logits = target.step(state, torch.tensor([[11, 12]]))
    torch.testing.assert_close(logits[0, -1], fresh_logits(target, prompt + [35, 11, 12]), atol=1e-5, rtol=1e-5)
    assert int(state.lengths[0]) == len(prompt) + 3


def test_ragged_rows_match_single_row_runs(target, prompts):
    state = target.prefill(prompts, room=32)
    for b, p in enumerate(prompts):
        torch.testing.assert_close(state.logits[b], fresh_logits(target, p), atol=1e-5, rtol=1e-5)
    # per-row rollback of different amounts, then one batched step
    target.step(state, torch.tensor([[1, 2, 3]] * len(prompts)))
    back = torch.tensor([0, 1, 2, 3])
    state.rollback(back)
    logits = target.step(state, torch.tensor([[7]] * len(prompts)))
    for b, p in enumerate(prompts):
        seq = p + [1, 2, 3][: 3 - int(back[b])] + [7]
        torch.testing.assert_close(logits[b, 0], fresh_logits(target, seq), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("counts", [[1, 2, 3, 2], [2, 2, 2, 2]])
def test_padded_rows_append_like_ragged_ones_on_the_host_and_a_gpu(target, prompts, counts):
    """append_padded (a [B, P] block and counts) equals append_ragged on the host; on a GPU it runs all P
    columns and rolls the padding back by a device tensor: the same logits and lengths, nothing read back."""
    from mmaccel.lm.hf import HFCausalLM
    from tests.conftest import tiny_llama
    from tests.emulated_cuda import emulated_cuda, on_host

    block = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34], [41, 42, 43, 44]])
    ragged = target.prefill(prompts, room=32)
    expected = append_ragged(target, ragged, [row[:c] for row, c in zip(block, counts)])
    state = target.prefill(prompts, room=32)
    torch.testing.assert_close(append_padded(target, state, block, torch.tensor(counts)), expected)
    assert torch.equal(state.lengths, ragged.lengths)
    with emulated_cuda() as report:
        model = HFCausalLM(tiny_llama(0, layers=3).to("cuda"))
        state = model.prefill(prompts, room=32)
        block, counts = block.cuda(), torch.tensor(counts).cuda()
        report.syncs.clear()
        report.uploads = 0
        logits = append_padded(model, state, block, counts)
        assert not report.syncs and report.uploads == 0, (report.kinds(), report.uploads)
        torch.testing.assert_close(on_host(logits), expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(on_host(state.lengths), ragged.lengths)


def test_tree_step_scores_every_path_like_a_chain(target):
    prompt = [5, 6, 7]
    # root 10 with children 20, 21; 20 has child 30; 21 has child 31
    tree = TokenTree(torch.tensor([[10, 20, 21, 30, 31]]), torch.tensor([[-1, 0, 0, 1, 2]]))
    state = target.prefill([prompt], room=32)
    logits = target.step(state, tree.tokens, tree_mask=tree.mask())
    for node, path in {3: [10, 20, 30], 4: [10, 21, 31], 2: [10, 21]}.items():
        torch.testing.assert_close(logits[0, node], fresh_logits(target, prompt + path), atol=1e-5, rtol=1e-5)
    # keep the path root → 21 → 31 and continue: equals a fresh prefill of that sequence
    state.keep_appended(torch.tensor([[0, 2, 4]]), torch.tensor([3]), appended=5)
    nxt = target.step(state, torch.tensor([[44]]))
    torch.testing.assert_close(nxt[0, 0], fresh_logits(target, prompt + [10, 21, 31, 44]), atol=1e-5, rtol=1e-5)


def test_keep_appended_moves_only_entries_out_of_place():
    cache = KVCache(2, 2, 2, 4, capacity=16)
    cache.reserve(3)
    cache.reserve(5)
    for buf in (*cache.k, *cache.v):
        buf.copy_(torch.arange(16.0)[None, None, :, None].expand_as(buf))
    before = [buf.clone() for buf in (*cache.k, *cache.v)]
    # row 0 keeps a chain-shaped path (nothing moves); row 1 a path ending on node 4 (one entry moves)
    cache.keep_appended(torch.tensor([[0, 1, 2], [0, 1, 4]]), torch.tensor([3, 3]), appended=5)
    assert cache.lengths.tolist() == [6, 6]
    for buf, old in zip((*cache.k, *cache.v), before):
        assert torch.equal(buf[0], old[0])
        assert buf[1, 0, :6, 0].tolist() == [0, 1, 2, 3, 4, 7]
    cache.keep_appended(torch.tensor([[0, 1], [0, 1]]), torch.tensor([1, 2]), appended=3)    # all in place
    assert cache.lengths.tolist() == [4, 5]


def test_the_token_record_follows_the_entries():
    """`keep_ids`: each slot's token id, written by the append and moved with its keys/values."""
    cache = KVCache(1, 2, 1, 2, capacity=16)
    ids = cache.keep_ids()
    write, _ = cache.reserve(3)
    write.record(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    cache.rollback(torch.tensor([0, 1]))                                  # row 1 drops token 6
    write, _ = cache.reserve(4)                                           # ragged: a scattered write
    write.record(torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]]))
    cache.keep_appended(torch.tensor([[0, 2], [1, 3]]), torch.tensor([2, 1]), appended=4)
    assert cache.lengths.tolist() == [5, 3]
    assert ids[0, :5].tolist() == [1, 2, 3, 10, 12] and ids[1, :3].tolist() == [4, 5, 21]
    cache.select_rows(torch.tensor([1, 1, 0]))
    assert cache.ids[:, :3].tolist() == [[4, 5, 21], [4, 5, 21], [1, 2, 3]]
    assert KVCache(1, 1, 1, 2, capacity=4).ids is None                   # recorded only when asked for


def test_rollback_is_a_pointer_move():
    cache = KVCache(2, 3, 2, 4, capacity=16)
    cache.reserve(10)
    before = cache.k[0].data_ptr()
    cache.rollback(torch.tensor([1, 5, 10]))
    assert cache.lengths.tolist() == [9, 5, 0] and cache.k[0].data_ptr() == before


@pytest.mark.parametrize("bad, message", [
    (lambda m, s: m.step(s, torch.tensor([1, 2])), "shape"),
    (lambda m, s: m.step(s, torch.tensor([[1.0, 2.0]])), "integer"),
    (lambda m, s: m.step(s, torch.tensor([[1000]])), "token ids"),
    (lambda m, s: m.step(s, torch.tensor([[1], [2]])), "batch"),
    (lambda m, s: m.step(s, torch.zeros(1, 0, dtype=torch.long)), "at least one"),
    (lambda m, s: s.rollback(99), "roll back"),
    (lambda m, s: s.rollback(-1), ">= 0"),
    (lambda m, s: m.step(s, torch.ones(1, 40, dtype=torch.long)), "overflow"),
    (lambda m, s: m.step(s, torch.ones(1, 2, dtype=torch.long), tree_mask=torch.ones(1, 3, 3, dtype=torch.bool)), "tree_mask"),
])
def test_bad_input_gives_a_named_error(target, bad, message):
    state = target.prefill([[1, 2, 3]], room=29)
    with pytest.raises(InputError, match=message):
        bad(target, state)


def test_empty_prompt_is_rejected(target):
    with pytest.raises(InputError, match="at least one token"):
        target.prefill([[]], room=8)
    with pytest.raises(InputError, match="non-empty"):
        target.prefill([], room=8)
