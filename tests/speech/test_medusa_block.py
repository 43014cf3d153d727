"""Medusa-Block heads: the block's cache grows ragged like one causal pass, drafting through it is
lossless (chain and tree, batched), and the heads file carries the block."""

import pytest
import torch
from torch import nn

from mmaccel.core.adaptive import AdaptiveDrafting
from mmaccel.core.methods import Resources
from mmaccel.errors import InputError
from mmaccel.speech.decoder import EncodedAudio
from mmaccel.speech.draft import trainable
from mmaccel.speech.heads import WhisperHeads, load_heads, new_medusa_heads, save_heads
from mmaccel.speech.medusa_block import block_forward, new_medusa_block
from mmaccel.speech.methods import build_asr_method
from tests.conftest import scripted
from tests.speech.conftest import EOT, PROMPT, features

SHORTLIST = torch.tensor([0, 5, 12, 17, 23, 33, 40, 41, 50, EOT])


def _block(tiny_decoder, seed=5, vocab=None):
    torch.manual_seed(seed)
    block = new_medusa_block(tiny_decoder, new_medusa_heads(tiny_decoder, 3, vocab=vocab))
    for p in [*block.heads.parameters(), *trainable(block.layer).values()]:
        nn.init.normal_(p, std=0.2)
    return block


def test_ragged_appends_equal_one_causal_pass(tiny_decoder):
    block = _block(tiny_decoder).layer.decoder_model(tiny_decoder)
    inputs = tiny_decoder.encode(features(2), PROMPT)
    hidden = torch.randn(2, 6, 32)
    with torch.no_grad():
        whole = block.new_state(2, 8)
        whole.extras["inputs"] = inputs
        ref = block_forward(block, whole, hidden)
        part = block.new_state(2, 8)
        part.extras["inputs"] = inputs
        block_forward(block, part, hidden[:, :2])
        # row 0 commits 3 more positions, row 1 only 1 (the rest of its append is padding, rolled back)
        out = block_forward(block, part, torch.stack([hidden[0, 2:5], torch.cat([hidden[1, 2:3], torch.zeros(2, 32)])]))
        part.rollback(torch.tensor([0, 2]))
        torch.testing.assert_close(out[0], ref[0, 2:5], atol=1e-5, rtol=0)
        torch.testing.assert_close(out[1, 0], ref[1, 2], atol=1e-5, rtol=0)
        last = block_forward(block, part, torch.stack([hidden[0, 5:6], hidden[1, 3:4]]))
        torch.testing.assert_close(last[0, 0], ref[0, 5], atol=1e-5, rtol=0)
        assert part.lengths.tolist() == [6, 4]


@pytest.mark.parametrize("params,vocab", [({"depth": 3, "width": 2}, None), ({"depth": 3, "width": 1}, SHORTLIST),
                                          ({"depth": 2, "width": 3}, None)])
def test_medusa_block_equals_greedy(tiny_decoder, params, vocab):
    block = _block(tiny_decoder, vocab=vocab)
    resources = Resources(tiny_decoder, extras={"medusa_block": block})
    x = features(3, seed=11)
    greedy = build_asr_method("greedy").run(resources, tiny_decoder.encode(x, PROMPT), max_new_tokens=24, eos_token_id=EOT)
    fast = build_asr_method("medusa-block", **params).run(resources, tiny_decoder.encode(x, PROMPT), max_new_tokens=24,
                                                          eos_token_id=EOT)
    assert fast.tokens == greedy.tokens
    with pytest.raises(InputError, match="needs a trained Medusa block"):
        build_asr_method("medusa-block").run(Resources(tiny_decoder), tiny_decoder.encode(x, PROMPT), max_new_tokens=4,
                                             eos_token_id=EOT)


def test_a_block_that_knows_the_answer_is_accepted(tiny_hf, tiny_decoder, monkeypatch):
    # the block (with head 0) fitted to one utterance's greedy transcript must have its drafts
    # accepted there: the decode loop feeds it the same hidden-state sequence training saw
    x = features(1, seed=3)
    inputs = tiny_decoder.encode(x, PROMPT)
    greedy = build_asr_method("greedy").run(Resources(tiny_decoder), inputs, max_new_tokens=16, eos_token_id=EOT)
    seq = torch.tensor([PROMPT + greedy.tokens[0]])
    final, _ = tiny_decoder.teacher_forced(tiny_decoder.encode(x, PROMPT), seq[:, len(PROMPT):])
    hidden = final[:, len(PROMPT) - 1 : -1].clone()              # positions P-1 .. : the block's sequence
    targets = seq[0, len(PROMPT) + 1 :]                          # head 0: the token two ahead of each position
    block = _block(tiny_decoder, seed=1)
    dm = block.layer.decoder_model(tiny_decoder)
    params = [*block.heads[0].parameters(), *trainable(block.layer).values()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=1e-2)
    for _ in range(150):
        state = dm.new_state(1, hidden.shape[1])
        state.extras["inputs"] = EncodedAudio(inputs.encoder_states.clone(), inputs.prompt,    # out of inference mode
                                              {k: (a.clone(), b.clone()) for k, (a, b) in inputs.cross_kv.items()})
        out = block_forward(dm, state, hidden)[0, : len(targets)]
        loss = nn.functional.cross_entropy(block.heads[0](out), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    block.layer.hf.requires_grad_(False)
    block.heads.requires_grad_(False)
    for p in tiny_hf.parameters():      # the shared model's tied projection took gradients: none for later tests
        p.grad = None
    fast = build_asr_method("medusa-block", depth=1, width=1).run(
        Resources(tiny_decoder, extras={"medusa_block": block}), tiny_decoder.encode(x, PROMPT), max_new_tokens=16,
        eos_token_id=EOT)
    assert fast.tokens == greedy.tokens and fast.stats.mean_accepted > 1.5
    # adaptive drafting, two plain passes beside each tree: the block reads those passes' states too
    for schedule in ((1, 0, 0), (0, 0, 1)):
        scripted(monkeypatch, schedule)
        adapted = build_asr_method("medusa-block", depth=1, width=1).run(
            Resources(tiny_decoder, extras={"medusa_block": block}), tiny_decoder.encode(x, PROMPT),
            max_new_tokens=16, eos_token_id=EOT, adaptive=AdaptiveDrafting())
        assert adapted.tokens == greedy.tokens and adapted.stats.accepted_hist.get(2, 0) >= 3


def test_heads_file_carries_the_block(tiny_decoder, tmp_path):
    block = _block(tiny_decoder, vocab=SHORTLIST)
    with torch.no_grad():                                # fp16-representable: the file stores fp16
        for p in [*block.heads.parameters(), *trainable(block.layer).values()]:
            p.copy_(p.half())
    path = save_heads(tmp_path / "heads.safetensors", tiny_decoder, WhisperHeads(vocab=SHORTLIST, block=block))
    back = load_heads(path, tiny_decoder).block
    assert back is not None and len(back.heads) == 3 and back.layer.layers == [3]
    for name, p in trainable(back.layer).items():
        torch.testing.assert_close(p, trainable(block.layer)[name], atol=0, rtol=0)
    h = torch.randn(2, 32)
    torch.testing.assert_close(back.heads[1](h), block.heads[1](h), atol=0, rtol=0)
