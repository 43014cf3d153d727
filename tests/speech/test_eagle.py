"""The EAGLE head: training passes compute what drafting computes (the unrolled training-time test
included), drafting with it is lossless (batched, ragged, shortlist, int8, siblings), a head that
knows the answer is accepted, and the heads file carries it."""

import pytest
import torch
from torch import nn

from mmaccel.core.adaptive import AdaptiveDrafting
from mmaccel.core.methods import Resources
from mmaccel.core.proposers import DraftModelProposer
from mmaccel.core.sampling import Sampling
from mmaccel.errors import InputError
from mmaccel.speech.decoder import EncodedAudio
from mmaccel.speech.draft import trainable
from mmaccel.speech.eagle import EagleDecoder, EagleProposer, new_eagle_head
from mmaccel.speech.heads import WhisperHeads, load_heads, merge_heads, new_exit_heads, save_heads
from mmaccel.speech.methods import build_asr_method
from mmaccel.speech.train.eagle import batch, first_entry, unroll_mask, unrolled
from tests.conftest import scripted
from tests.speech.conftest import EOT, PROMPT, VOCAB, features

SHORTLIST = torch.tensor([0, 5, 12, 17, 23, 33, 40, 41, 50, EOT])


def _head(tiny_decoder, seed=5, std=0.2, vocab=None, cross_window=None, layers=(-1,), start=True, fuse=()):
    torch.manual_seed(seed)
    head = new_eagle_head(tiny_decoder, cross_window, layers, start, fuse)
    with torch.no_grad():
        for p in _mixed(head):
            p.add_(torch.randn_like(p) * std)
    if start:
        head.start = torch.randn_like(head.start)
    head.layer.vocab = vocab
    return head


def _mixed(head):
    """The head's own parameters: its layers, fc and fusion."""
    return [*trainable(head.layer).values(), *head.fc.parameters(), *(head.fuse.parameters() if head.fuse else [])]


def _target(tiny_decoder, head):
    """The target as the pipeline runs it for `head`: with the layer outputs a fused head reads."""
    return tiny_decoder.feature_view(head.feature_layers) if head.feature_layers else tiny_decoder


def _detached(inputs: EncodedAudio) -> EncodedAudio:
    """A copy made outside inference mode (for passes with gradients)."""
    return EncodedAudio(inputs.encoder_states.clone(), inputs.prompt,
                        {k: (a.clone(), b.clone()) for k, (a, b) in inputs.cross_kv.items()})


def test_unroll_mask_sees_the_real_prefix_and_its_own_drafts():
    # pass 3, entry 4: real entries 0..2, pass 2's entry 3, itself (pass 3's entry 4)
    m = unroll_mask(6, 3)[0, 0]
    assert m.shape == (6, 18)
    assert m[4].nonzero()[:, 0].tolist() == [0, 1, 2, 6 + 3, 12 + 4]
    assert unroll_mask(4, 1)[0, 0].equal(torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("layers,fuse", [((-1,), ()), ((0, -1), ()), ((-1,), (0, 2))])
def test_training_passes_equal_drafting(tiny_decoder, layers, fuse):
    # entries 0..n0-1 are the prompt's (start feature), then real (feature, token) pairs
    head = _head(tiny_decoder, layers=layers, fuse=fuse)
    dec = EagleDecoder(head, tiny_decoder)
    inputs = tiny_decoder.encode(features(2), PROMPT)
    tiny_decoder.prefill(inputs, 4)                       # the target's cross-attention keys/values
    n0 = len(PROMPT) - 1
    torch.manual_seed(0)
    feats, tokens = torch.randn(2, n0 + 6, 32 * (len(fuse) + 1)) * 5, torch.randint(0, VOCAB, (2, n0 + 6))
    tokens[:, :n0] = torch.tensor(PROMPT[1:])
    with torch.no_grad():
        passes = unrolled(head, head.layer.decoder_model(tiny_decoder), inputs, feats, tokens, 3, n0)
    checked = 0
    for j in range(n0 - 1, n0 + 6):
        for s in (1, 2, 3):                              # draft s of a chain whose real entries end at j - s + 1
            real = j - s + 1
            if real < n0 - 1:
                continue
            state = dec.prefill(inputs, 12)
            logits = dec.start(state, inputs.prompt)
            if real >= n0:
                logits = dec.feed(state, feats[:, n0 : real + 1], tokens[:, n0 : real + 1], torch.tensor([real + 1 - n0] * 2))
            g = state.extras["feature"][:, 0]
            for t in range(real + 1, j + 1):            # the head's own outputs as features
                dec.step(state, tokens[:, t : t + 1])
                g = state.extras["feature"][:, 0]
            torch.testing.assert_close(passes[s - 1][:, j], g, atol=1e-5, rtol=0)
            assert logits.shape == (2, VOCAB)
            checked += 1
    assert checked == 7 + 6 + 5


def test_the_first_scored_entry_of_each_pass():
    assert [first_entry(3, s) for s in range(3)] == [2, 3, 4]     # from the last prompt entry on
    assert [first_entry(0, s) for s in range(3)] == [0, 1, 2]     # no prompt entries: from the first real one


def test_ragged_feeds_equal_one_causal_pass(tiny_decoder):
    dec = EagleDecoder(_head(tiny_decoder), tiny_decoder)
    inputs = tiny_decoder.encode(features(2), PROMPT)
    feats, tokens = torch.randn(2, 5, 32) * 5, torch.randint(0, VOCAB, (2, 5))
    whole = dec.prefill(inputs, 8)
    with torch.inference_mode():
        ref = dec.outputs(whole, dec.head.normalized(feats), tokens)
    part = dec.prefill(inputs, 8)
    dec.feed(part, feats[:, :2], tokens[:, :2], torch.tensor([2, 2]))
    dec.feed(part, feats[:, 2:5], tokens[:, 2:5], torch.tensor([3, 1]))   # row 1 commits one of three
    assert part.cache.lengths.tolist() == [5, 3]
    torch.testing.assert_close(part.extras["feature"][:, 0], torch.stack([ref[0, 4], ref[1, 2]]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("params,vocab,window,layers,start,fuse", [
    ({"k": 3, "stop_below": 0.0}, None, None, (-1,), True, ()), ({"k": 4}, SHORTLIST, None, (-1,), False, ()),
    ({"k": 5, "siblings": 2}, None, 3, (0, -1), True, ()),
    ({"k": 6, "stop_below": 0.5, "siblings": 1}, SHORTLIST, 0, (-1,), True, ()),
    ({"k": 2, "stop_below": 0.0}, SHORTLIST, 2, (1,), False, ()),
    ({"k": 4, "stop_below": 0.0}, SHORTLIST, 3, (-1,), True, (0, 1)), ({"k": 5, "siblings": 2}, None, None, (-1,), False, (2,)),
])
def test_eagle_equals_greedy(tiny_decoder, params, vocab, window, layers, start, fuse):
    head = _head(tiny_decoder, vocab=vocab, cross_window=window, layers=layers, start=start, fuse=fuse)
    resources = Resources(_target(tiny_decoder, head), extras={"eagle": EagleDecoder(head, tiny_decoder)})
    x = features(3, seed=11)
    seconds = [0.1, 0.3, 0.2]
    greedy = build_asr_method("greedy").run(resources, tiny_decoder.encode(x, PROMPT, seconds), max_new_tokens=24,
                                            eos_token_id=EOT)
    fast = build_asr_method("eagle", **params).run(resources, tiny_decoder.encode(x, PROMPT, seconds), max_new_tokens=24,
                                                   eos_token_id=EOT, prompt_tokens=[PROMPT] * 3)
    assert fast.tokens == greedy.tokens
    assert fast.stats.draft_passes > 0


def test_a_feature_view_keeps_the_layer_outputs_and_changes_nothing_else(tiny_decoder):
    view = tiny_decoder.feature_view((2, 0))
    assert view.feature_layers == (0, 2) and tiny_decoder.feature_layers == ()
    inputs = tiny_decoder.encode(features(2), PROMPT)
    tokens = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    plain, wide = tiny_decoder.prefill(inputs, 8), view.prefill(inputs, 8)
    torch.testing.assert_close(wide.logits, plain.logits, atol=0, rtol=0)
    a, b = tiny_decoder.step(plain, tokens), view.step(wide, tokens, valid=torch.tensor([5, 3]))
    torch.testing.assert_close(b[1, :3], a[1, :3], atol=1e-6, rtol=0)
    assert wide.hidden.shape == (2, 5, 3 * 32)
    torch.testing.assert_close(wide.hidden[0, :, 64:], plain.hidden[0], atol=1e-6, rtol=0)
    final, layers = tiny_decoder.teacher_forced(inputs, tokens)      # the training data's layer outputs
    P = len(PROMPT)
    torch.testing.assert_close(wide.hidden[0, :, :32], layers[0][0, P:], atol=1e-5, rtol=0)
    torch.testing.assert_close(wide.hidden[0, :, 32:64], layers[2][0, P:], atol=1e-5, rtol=0)
    with pytest.raises(InputError, match="feature layers must lie in"):
        tiny_decoder.feature_view((4,))


def test_a_head_that_knows_the_answer_is_accepted_and_the_output_is_greedys(tiny_decoder, monkeypatch):
    # fitted with the training passes to two utterances' greedy transcripts, the head's drafts must be
    # accepted there, batched, on the int8 path the pipeline uses on a CPU
    x = features(2, seed=3)
    greedy = build_asr_method("greedy").run(Resources(tiny_decoder), tiny_decoder.encode(x, PROMPT), max_new_tokens=16,
                                            eos_token_id=EOT)
    inputs = tiny_decoder.encode(x, PROMPT)
    T = max(len(g) for g in greedy.tokens)
    seq = torch.full((2, T), EOT)
    for b, g in enumerate(greedy.tokens):
        seq[b, : len(g)] = torch.tensor(g)
    final, _ = tiny_decoder.teacher_forced(inputs, seq)
    P = len(PROMPT)
    rows = [{"tokens": torch.tensor(PROMPT + g), "prompt_len": P, "final": final[b, P - 1 : P - 1 + len(g)].clone()}
            for b, g in enumerate(greedy.tokens)]
    lookup = torch.arange(VOCAB)
    feats, tokens, target, nxt, n0 = batch(rows, [0, 1], lookup, prompt=True)
    assert n0 == P - 1 and tokens[0, :n0].tolist() == PROMPT[1:] and target[0, n0 - 1] == greedy.tokens[0][0]
    head = _head(tiny_decoder, seed=1, std=0.05)
    head.start = nn.Parameter(head.start)
    dm = head.layer.decoder_model(tiny_decoder)
    params = [*trainable(head.layer).values(), *head.fc.parameters(), head.start]
    for p in params:
        p.requires_grad_(True)
    weight = tiny_decoder.decoder.embed_tokens.weight.detach()
    opt = torch.optim.Adam(params, lr=1e-2)
    for _ in range(120):
        outs = unrolled(head, dm, _detached(inputs), feats, tokens, 2, n0)
        keep = target >= 0
        loss = sum(nn.functional.cross_entropy(nn.functional.linear(g[keep], weight), target[keep]) for g in outs)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p in params:
        p.requires_grad_(False)
    head.start = head.start.detach()
    assert tiny_decoder.decoder.embed_tokens.weight.grad is None        # the target stays frozen
    resources = Resources(tiny_decoder, extras={"eagle": EagleDecoder(head, tiny_decoder, quantized=True)})
    plain = build_asr_method("eagle", k=4, stop_below=0.0).run(resources, tiny_decoder.encode(x, PROMPT),
                                                               max_new_tokens=16, eos_token_id=EOT,
                                                               prompt_tokens=[PROMPT] * 2)
    assert plain.tokens == greedy.tokens and plain.stats.mean_accepted > 2.0
    assert plain.stats.nfe < greedy.stats.nfe
    # adaptive drafting, every other pass plain: the head catches up on those passes' features and tokens
    # (were one lost, its drafts would be a position off and rejected); the second schedule starts plain,
    # with no drafts ahead of the prefill
    for schedule in ((4, 0), (0, 4)):
        scripted(monkeypatch, schedule)
        adapted = build_asr_method("eagle", k=4, stop_below=0.0).run(
            resources, tiny_decoder.encode(x, PROMPT), max_new_tokens=16, eos_token_id=EOT,
            prompt_tokens=[PROMPT] * 2, adaptive=AdaptiveDrafting())
        assert adapted.tokens == greedy.tokens and adapted.stats.mean_accepted > 1.6
    assert EagleProposer(resources.extras["eagle"]).drafts_from_prompt      # the prefill verified the first drafts


@pytest.mark.parametrize("layers,start,fuse", [((-1,), True, ()), ((0, -1), True, ()), ((-1,), False, ()),
                                               ((-1,), True, (0, 2))])
def test_heads_file_carries_the_eagle_head(tiny_decoder, tmp_path, layers, start, fuse):
    head = _head(tiny_decoder, vocab=SHORTLIST, cross_window=7, layers=layers, start=start, fuse=fuse)
    with torch.no_grad():                                # fp16-representable: the file stores fp16
        for p in _mixed(head):
            p.copy_(p.half())
    path = save_heads(tmp_path / "heads.safetensors", tiny_decoder, WhisperHeads(vocab=SHORTLIST, eagle=head))
    back = load_heads(path, tiny_decoder)
    assert back.block is None and back.medusa is None and back.eagle is not None
    assert back.eagle.layer.cross_window == 7 and back.eagle.layer.vocab.tolist() == SHORTLIST.tolist()
    assert back.eagle.layer.layers == head.layer.layers
    for name, p in trainable(back.eagle.layer).items():
        torch.testing.assert_close(p, trainable(head.layer)[name], atol=0, rtol=0)
    torch.testing.assert_close(back.eagle.fc.weight, head.fc.weight, atol=0, rtol=0)
    assert back.eagle.feature_layers == fuse and (back.eagle.fuse is None) == (not fuse)
    if fuse:
        torch.testing.assert_close(back.eagle.fuse.weight, head.fuse.weight, atol=0, rtol=0)
    if start:
        torch.testing.assert_close(back.eagle.start, head.start, atol=0, rtol=0)
    else:
        assert back.eagle.start is None
    assert back.eagle.layer.timestamps is False and back.eagle.layer.decoder_model(tiny_decoder).reads_timestamps_as_none
    head.layer.timestamps = True                         # trained on timestamp-mode transcripts too
    back = load_heads(save_heads(tmp_path / "timed.safetensors", tiny_decoder, WhisperHeads(eagle=head)), tiny_decoder)
    assert back.eagle.layer.timestamps is True
    assert not back.eagle.layer.decoder_model(tiny_decoder).reads_timestamps_as_none


def test_heads_of_several_files_merge_and_a_kind_comes_from_one_file(tiny_decoder, tmp_path):
    exits = save_heads(tmp_path / "exits.safetensors", tiny_decoder,
                       WhisperHeads(exits=new_exit_heads(tiny_decoder, [1], SHORTLIST), vocab=SHORTLIST))
    eagle = save_heads(tmp_path / "eagle.safetensors", tiny_decoder, WhisperHeads(eagle=_head(tiny_decoder)))
    parts = [load_heads(f, tiny_decoder) for f in (exits, eagle)]
    merged = merge_heads(parts, ["exits", "eagle"])
    assert sorted(merged.exits) == [1] and merged.eagle is parts[1].eagle
    assert merged.vocab.tolist() == SHORTLIST.tolist() and merged.medusa is None
    with pytest.raises(InputError, match="eagle and again both carry eagle heads"):
        merge_heads(parts + [load_heads(eagle, tiny_decoder)], ["exits", "eagle", "again"])


def test_bad_eagle_calls_are_named(tiny_decoder):
    inputs = tiny_decoder.encode(features(1), PROMPT)
    with pytest.raises(InputError, match="needs a trained EAGLE head"):
        build_asr_method("eagle").run(Resources(tiny_decoder), inputs, max_new_tokens=4, eos_token_id=EOT)
    with pytest.raises(InputError, match="takes an EagleDecoder"):
        build_asr_method("eagle").run(Resources(tiny_decoder, extras={"eagle": _head(tiny_decoder)}), inputs,
                                      max_new_tokens=4, eos_token_id=EOT)
    resources = Resources(tiny_decoder, extras={"eagle": EagleDecoder(_head(tiny_decoder), tiny_decoder)})
    with pytest.raises(InputError, match="no temperature"):
        build_asr_method("eagle").run(resources, tiny_decoder.encode(features(1), PROMPT), max_new_tokens=4,
                                      sampling=Sampling(temperature=1.0), eos_token_id=EOT)
    with pytest.raises(InputError, match="need stop_below > 0"):
        build_asr_method("eagle", stop_below=0.0, siblings=1)
    with pytest.raises(InputError, match="k must be an integer"):
        build_asr_method("eagle", k=0)
    fused = EagleDecoder(_head(tiny_decoder, fuse=(1,)), tiny_decoder)   # on a target without the layer outputs
    with pytest.raises(InputError, match="reads 2 features of size 32, got 32 values"):
        build_asr_method("eagle").run(Resources(tiny_decoder, extras={"eagle": fused}), inputs, max_new_tokens=4,
                                      eos_token_id=EOT)
    for bad in [(3,), (1, 1), (-1,)]:
        with pytest.raises(InputError, match="feature layers must be distinct target layers in"):
            new_eagle_head(tiny_decoder, feature_layers=bad)


def test_in_timestamp_mode_drafts_ahead_open_with_the_first_timestamp_then_draft_as_without(tiny_en_asr):
    """Drafts trained without timestamps read each as <|notimestamps|>: ahead of the prefill in timestamp mode they
    take <|0.00|> as given (where <|notimestamps|> ends the prompt without timestamps), so what they draft after it
    is what they draft without timestamps, the EAGLE head and the draft decoder alike."""
    from mmaccel.speech.audio import load_audio, log_mel, split_long
    from mmaccel.speech.data import real_utterances
    from mmaccel.speech.draft import new_draft
    from mmaccel.speech.timestamps import TimestampRules

    asr, tokens = tiny_en_asr, tiny_en_asr.bundle.tokens
    clip = split_long(load_audio(real_utterances()[0].audio_filepath))[0]
    x = log_mel(asr.bundle.feature_extractor, [clip])
    plain_prompt, timed_prompt = asr.bundle.prompt("en"), asr.bundle.prompt("en", "transcribe", True)
    rules = TimestampRules(tokens.no_timestamps, tokens.end_of_text, len(timed_prompt))
    draft = new_draft(asr.model.hf, (0, -1))
    draft.vocab = torch.arange(tokens.end_of_text + 1)                  # the text tokens and <|endoftext|>
    for make in (lambda: EagleProposer(asr.resources().extras["eagle"]),
                 lambda: DraftModelProposer(draft.decoder_model(asr.model))):
        plain = make().start_drafting(asr.model.encode(x, plain_prompt), 32, 4)
        timed_inputs = asr.model.encode(x, timed_prompt, rules=rules)
        proposer = make()
        assert proposer.can_start_drafting(timed_inputs)        # tiny.en's timed prompt is <|startoftranscript|> alone
        timed = proposer.start_drafting(timed_inputs, 32, 4)
        assert timed[0, 0] == rules.timestamp_begin and timed[0, 1:].tolist() == plain[0, :3].tolist()
        assert proposer._fed == 3                                # <|0.00|> and two drafts: rolled back as drafts are
        assert proposer.start_drafting(timed_inputs, 32, 1).tolist() == [[rules.timestamp_begin]]
    # a draft trained on timestamp-mode transcripts reads timestamps as they are: nothing is given, it drafts them
    draft.timestamps = True
    timed_inputs = asr.model.encode(x, timed_prompt, rules=rules)
    reader = draft.decoder_model(asr.model)
    assert reader.opening(timed_inputs) is None and reader.as_read(reader.prefill(timed_inputs, 8), torch.tensor(
        [[rules.timestamp_begin]])).item() == rules.timestamp_begin
    proposer = DraftModelProposer(reader)
    assert proposer.start_drafting(timed_inputs, 32, 2).shape == (1, 2)
