"""The Whisper decoder adapter: exact against Hugging Face, tree masks, row selection, early exit,
beam search, and every lossless method bit-identical to greedy."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmaccel.core.beam import beam_search
from mmaccel.core.methods import Resources
from mmaccel.errors import InputError
from mmaccel.speech.decoder import ArgmaxProjection, EncodedAudio, ExitHead, WhisperDecoderModel
from mmaccel.speech.heads import new_exit_heads, new_medusa_heads
from mmaccel.speech.methods import build_asr_method
from tests.speech.conftest import EOT, PROMPT, SUPPRESS, features

MASKED = SUPPRESS + [EOT]


def test_logits_equal_hugging_face_and_suppress_whispers_tokens(tiny_hf, tiny_decoder):
    x = features(2)
    ids = torch.tensor([PROMPT + [5, 9, 11], PROMPT + [4, 4, 20]])
    with torch.no_grad():
        ref = tiny_hf(input_features=x, decoder_input_ids=ids).logits
    state = tiny_decoder.prefill(tiny_decoder.encode(x, PROMPT), 8)
    first = ref[:, len(PROMPT) - 1].clone()
    first[:, MASKED] = float("-inf")
    torch.testing.assert_close(state.logits, first, atol=2e-5, rtol=0)
    out = tiny_decoder.step(state, ids[:, len(PROMPT):])
    want = ref[:, len(PROMPT):].clone()
    want[..., SUPPRESS] = float("-inf")
    torch.testing.assert_close(out, want, atol=2e-5, rtol=0)


def test_greedy_equals_hugging_face_generate(tiny_hf, tiny_decoder):
    x = features(3, seed=4)
    ours = build_asr_method("greedy").run(Resources(tiny_decoder), tiny_decoder.encode(x, PROMPT), max_new_tokens=20,
                                          eos_token_id=EOT)
    with torch.no_grad():
        hf = tiny_hf.generate(input_features=x, decoder_input_ids=torch.tensor([PROMPT] * 3), max_new_tokens=20,
                              do_sample=False, num_beams=1)
    assert ours.tokens == [[t for t in row if t not in PROMPT] for row in hf.tolist()]
    assert len({tuple(r) for r in ours.tokens}) > 1, "rows should differ (audio-dependent transcripts)"


def test_tree_mask_sees_only_ancestors(tiny_decoder):
    inputs = tiny_decoder.encode(features(1), PROMPT)
    # tokens a, b, c where c hangs off a (a sibling of b): c must score as the chain a -> c
    tree = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], dtype=torch.bool)
    state = tiny_decoder.prefill(inputs, 8)
    out = tiny_decoder.step(state, torch.tensor([[5, 9, 11]]), tree_mask=tree)
    chain = tiny_decoder.prefill(inputs, 8)
    ref = tiny_decoder.step(chain, torch.tensor([[5, 11]]))
    torch.testing.assert_close(out[:, [0, 2]], ref, atol=1e-5, rtol=0)


def test_select_rows_reorders_cache_and_audio(tiny_decoder):
    x = features(2, seed=7)
    state = tiny_decoder.prefill(tiny_decoder.encode(x, PROMPT), 8)
    a = tiny_decoder.step(state, torch.tensor([[5], [6]]))
    tiny_decoder.select_rows(state, torch.tensor([1, 1, 0]))
    b = tiny_decoder.step(state, torch.tensor([[9], [9], [9]]))
    ref_state = tiny_decoder.prefill(tiny_decoder.encode(x[[1]], PROMPT), 8)
    tiny_decoder.step(ref_state, torch.tensor([[6]]))
    ref = tiny_decoder.step(ref_state, torch.tensor([[9]]))
    torch.testing.assert_close(b[0], ref[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(b[1], ref[0], atol=1e-5, rtol=0)
    assert a.shape[0] == 2


def test_rows_sharing_a_window_decode_as_rows_with_their_own_copy(tiny_decoder):
    encoded = tiny_decoder.encode(features(2, seed=7), PROMPT)
    shared, copies = encoded.repeat(3), encoded.select_rows(torch.arange(2).repeat_interleave(3), tiny_decoder.device)
    assert shared.batch_size == copies.batch_size == 6 and shared.encoder_states.shape[0] == 2
    tokens = torch.tensor([[5, 7], [6, 2], [9, 9], [5, 7], [3, 1], [4, 8]])       # each row its own tokens
    out = []
    for inputs in (shared, copies):
        state = tiny_decoder.prefill(inputs, 8)
        out.append(torch.cat([state.logits[:, None], tiny_decoder.step(state, tokens)], 1))
    torch.testing.assert_close(out[0], out[1], atol=1e-5, rtol=0)
    state = tiny_decoder.prefill(shared, 8)
    tiny_decoder.select_rows(state, torch.tensor([4, 0]))        # rows of another window: a copy each again
    assert state.extras["inputs"].group == 1
    torch.testing.assert_close(tiny_decoder.step(state, tokens[:2, :1])[:, 0],
                               tiny_decoder.step(tiny_decoder.prefill(copies.select_rows(torch.tensor([4, 0]),
                                                                     tiny_decoder.device), 8), tokens[:2, :1])[:, 0])


def test_early_exit_view_shares_weights(tiny_hf, tiny_decoder):
    full = tiny_decoder.early_exit(4)
    inputs = tiny_decoder.encode(features(1), PROMPT)
    torch.testing.assert_close(full.prefill(inputs, 4).logits, tiny_decoder.prefill(inputs, 4).logits, atol=0, rtol=0)
    head = ExitHead(tiny_hf.model.decoder.layer_norm)           # zero block + copied norm = the final norm
    two = tiny_decoder.early_exit(2, head)
    plain = tiny_decoder.early_exit(2)
    torch.testing.assert_close(two.prefill(inputs, 4).logits, plain.prefill(inputs, 4).logits, atol=1e-6, rtol=0)
    with pytest.raises(InputError, match=r"exit layer must be an integer in \[1, 4\]"):
        tiny_decoder.early_exit(5)


def test_beam_search_one_beam_is_greedy_and_matches_hugging_face(tiny_hf, tiny_decoder):
    x = features(2, seed=3)
    inputs = lambda: tiny_decoder.encode(x, PROMPT)  # noqa: E731
    greedy = build_asr_method("greedy").run(Resources(tiny_decoder), inputs(), max_new_tokens=16, eos_token_id=EOT)
    assert beam_search(tiny_decoder, inputs(), num_beams=1, max_new_tokens=16, eos_token_id=EOT).tokens == greedy.tokens
    ours = beam_search(tiny_decoder, inputs(), num_beams=3, max_new_tokens=16, eos_token_id=EOT)
    with torch.no_grad():
        hf = tiny_hf.generate(input_features=x, decoder_input_ids=torch.tensor([PROMPT] * 2), max_new_tokens=16,
                              do_sample=False, num_beams=3)
    assert ours.tokens == [[t for t in row if t not in PROMPT] for row in hf.tolist()]


def _random_heads(model: WhisperDecoderModel, seed: int, vocab=None):
    torch.manual_seed(seed)
    medusa = new_medusa_heads(model, 4, vocab=vocab)
    exits = new_exit_heads(model, [1, 2], vocab)
    for module in [*medusa, *exits.values()]:
        for p in module.parameters():
            nn.init.normal_(p, std=0.3)
    return medusa, exits


SHORTLIST = torch.tensor([0, 5, 12, 17, 23, 33, 40, 41, 50])


@pytest.mark.parametrize("method,params,vocab", [
    ("medusa", {"depth": 3, "width": 2}, None), ("medusa", {"depth": 4, "width": 1}, None),
    ("medusa", {"depth": 3, "width": 2}, SHORTLIST), ("early-exit", {"k": 3, "exit_layer": 2}, None),
    ("early-exit", {"k": 2, "exit_layer": 1}, SHORTLIST), ("ngram", {"k": 3}, None),
])
def test_lossless_methods_equal_greedy(tiny_decoder, method, params, vocab):
    medusa, exits = _random_heads(tiny_decoder, 5, vocab)
    resources = Resources(tiny_decoder, heads=medusa, exit_heads=exits)
    x = features(3, seed=11)
    greedy = build_asr_method("greedy").run(resources, tiny_decoder.encode(x, PROMPT), max_new_tokens=24, eos_token_id=EOT)
    fast = build_asr_method(method, **params).run(resources, tiny_decoder.encode(x, PROMPT), max_new_tokens=24,
                                                  eos_token_id=EOT)
    assert fast.tokens == greedy.tokens
    assert fast.stats.nfe <= greedy.stats.nfe


def test_bad_inputs_are_named(tiny_decoder):
    with pytest.raises(InputError, match=r"features must be log-mel \[batch, 8, frames\]"):
        tiny_decoder.encode(torch.zeros(1, 80, 40), PROMPT)
    with pytest.raises(InputError, match="prefill takes EncodedAudio"):
        tiny_decoder.prefill(torch.zeros(1, 20, 32), 4)
    with pytest.raises(InputError, match="not a Whisper encoder-decoder"):
        WhisperDecoderModel(nn.Linear(2, 2))
    inputs = tiny_decoder.encode(features(1), PROMPT)
    assert isinstance(inputs, EncodedAudio)
    state = tiny_decoder.prefill(inputs, 4)
    with pytest.raises(InputError, match="token ids must lie in"):
        tiny_decoder.step(state, torch.tensor([[999]]))


def test_shortlisted_heads_draft_only_shortlist_tokens(tiny_decoder):
    medusa, exits = _random_heads(tiny_decoder, 5, SHORTLIST)
    logits = medusa[0](torch.randn(3, 32))
    assert set(logits.argmax(-1).tolist()) <= set(SHORTLIST.tolist())
    assert torch.isinf(logits[:, 1]).all() and torch.isfinite(logits[:, SHORTLIST]).all()
    view = tiny_decoder.early_exit(2, exits[2])
    state = view.prefill(tiny_decoder.encode(features(1), PROMPT), 4)
    assert int(state.logits.argmax()) in SHORTLIST.tolist()


def test_argmax_projection_has_the_fp32_argmax_even_at_near_ties():
    torch.manual_seed(0)
    weight = torch.randn(500, 32) * 0.2
    bias = torch.zeros(500)
    bias[[3, 7]] = float("-inf")
    h = torch.randn(64, 32) * 4
    # near-ties: make rows' top two tokens differ by far less than bf16 resolution
    exact = F.linear(h, weight) + bias
    top2 = exact.topk(2, dim=-1).indices
    weight2 = weight.clone()
    for r in range(0, 64, 4):
        a, b = top2[r]
        weight2[b] = weight2[a] + 1e-4 * torch.randn(32)
    exact = F.linear(h, weight2) + bias
    plain_bf16 = F.linear(h.bfloat16(), weight2.bfloat16()).float() + bias
    assert not torch.equal(plain_bf16.argmax(-1), exact.argmax(-1))          # the ties are real: bf16 alone errs
    fast = ArgmaxProjection(weight2, bias)(h)
    assert torch.equal(fast.argmax(-1), exact.argmax(-1))
    rows = torch.arange(64)
    torch.testing.assert_close(fast[rows, fast.argmax(-1)], exact[rows, exact.argmax(-1)], atol=1e-5, rtol=0)
    assert torch.isinf(fast[:, [3, 7]]).all()
    assert (fast - exact).abs()[torch.isfinite(exact)].max() < 0.1          # bf16-close elsewhere


def adversarial_rows(seed: int, rows: int = 256, vocab: int = 2000, d: int = 64):
    """Hidden states and an embedding where each row's fp32 winner (logit 40, clear of the random rest) has
    rivals at lower indices a hair below it: gaps from 1e-4 to 2e-2, far outside fp32's error and inside
    bf16's (its spacing at 40 is 0.25, so rounding makes them ties that the first index wins), with small
    off-axis parts that change only the rounding; and in every third row an exact copy of the winner at a
    lower index (a tie fp32 `argmax` breaks to the first)."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, d, generator=g) * 0.2
    h = torch.randn(rows, d, generator=g) * 4
    winner = torch.randint(vocab // 2, vocab, (rows,), generator=g)
    used = set()
    for r in range(rows):
        i = int(winner[r])
        if i in used:
            continue
        used.add(i)
        u = h[r] / h[r].norm()
        base = float((h[r] * weight[i]).sum())
        weight[i] += u * (40.0 - base) / h[r].norm()                 # the row's winner, well clear of the rest
        for j in torch.randint(0, vocab // 2, (6,), generator=g).tolist():
            if j in used:
                continue
            used.add(j)
            gap = float(10 ** torch.empty(1).uniform_(-4, math.log10(2e-2), generator=g))
            side = torch.randn(d, generator=g)
            side -= (side @ u) * u                                    # orthogonal to h: changes only the rounding
            weight[j] = weight[i] - u * gap / h[r].norm() + side * 0.05
        if r % 3 == 0:                                                # an exact tie at a lower index
            twin = int(torch.randint(0, vocab // 2, (1,), generator=g))
            if twin not in used:
                used.add(twin)
                weight[twin] = weight[i]
    return weight, h


def test_the_argmax_view_returns_the_fp32_argmax_on_adversarial_near_ties():
    """Every row's arg-max equals the fp32 projection's (ties to the first index, as `argmax` breaks them),
    though the bf16 product alone, the view without its recheck, gets most rows wrong."""
    bias = torch.zeros(2000)
    wrong_bf16, total = 0, 0
    for seed in range(6):
        weight, h = adversarial_rows(seed)
        exact = F.linear(h, weight).argmax(-1)
        assert torch.equal(ArgmaxProjection(weight, bias)(h).argmax(-1), exact), seed
        wrong_bf16 += int((F.linear(h.bfloat16(), weight.bfloat16()).float().argmax(-1) != exact).sum())
        total += len(exact)
    assert wrong_bf16 > total // 2                                     # a missed recheck flips most rows


def test_argmax_view_decodes_exactly_like_the_model(tiny_decoder):
    medusa, exits = _random_heads(tiny_decoder, 5)
    view = tiny_decoder.argmax_view()
    x = features(3, seed=11)
    greedy = build_asr_method("greedy").run(Resources(tiny_decoder), tiny_decoder.encode(x, PROMPT), max_new_tokens=24,
                                            eos_token_id=EOT)
    for name, params in (("greedy", {}), ("medusa", {"depth": 3, "width": 2}), ("early-exit", {"k": 2, "exit_layer": 2})):
        fast = build_asr_method(name, **params).run(Resources(view, heads=medusa, exit_heads=exits),
                                                    tiny_decoder.encode(x, PROMPT), max_new_tokens=24, eos_token_id=EOT)
        assert fast.tokens == greedy.tokens, name
    exact = tiny_decoder.prefill(tiny_decoder.encode(x, PROMPT), 4).logits
    first = view.prefill(tiny_decoder.encode(x, PROMPT), 4).logits
    assert torch.equal(first.argmax(-1), exact.argmax(-1))
    rows = torch.arange(3)
    torch.testing.assert_close(first[rows, first.argmax(-1)], exact[rows, exact.argmax(-1)], atol=1e-5, rtol=0)
    with pytest.raises(InputError, match="arg-max view is for the full model"):
        tiny_decoder.early_exit(2, exits[2]).argmax_view()


@pytest.mark.parametrize("view", ["model", "argmax"])
def test_prefill_with_scores_the_prompt_and_tokens_like_prefill_then_step(tiny_decoder, view):
    model = tiny_decoder if view == "model" else tiny_decoder.argmax_view()
    x = features(3, seed=5)
    tokens = torch.tensor([[5, 12, 0], [40, 41, 50], [17, 23, 33]])
    state, logits = model.prefill_with(tiny_decoder.encode(x, PROMPT), 6, tokens)
    ref = tiny_decoder.prefill(tiny_decoder.encode(x, PROMPT), 6)
    ref_steps = tiny_decoder.step(ref, tokens)
    assert logits.shape == (3, 4, tiny_decoder.vocab_size) and state.lengths.tolist() == [len(PROMPT) + 3] * 3
    assert torch.equal(logits.argmax(-1), torch.cat([ref.logits[:, None], ref_steps], 1).argmax(-1))
    assert torch.isinf(logits[:, 0, EOT]).all() and not torch.isinf(logits[:, 1:, EOT]).any()   # begin-suppressed row 0
    if view == "model":
        torch.testing.assert_close(logits[:, 0], ref.logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits[:, 1:], ref_steps, atol=1e-5, rtol=1e-5)
    state.rollback(2)                                      # then decodes on like any state
    torch.testing.assert_close(model.step(state, tokens[:, 1:2]).argmax(-1), ref_steps[:, 1:2].argmax(-1))
    with pytest.raises(InputError, match="token ids must lie in"):
        model.prefill_with(tiny_decoder.encode(x, PROMPT), 6, tokens + 100)
    with pytest.raises(InputError, match="do not fit the room"):
        model.prefill_with(tiny_decoder.encode(x, PROMPT), 2, tokens)


def test_argmax_projection_takes_a_bias_per_position():
    torch.manual_seed(1)
    weight, h = torch.randn(300, 32) * 0.2, torch.randn(2, 3, 32) * 4
    bias = torch.zeros(3, 300)
    top = (F.linear(h, weight)).argmax(-1)
    bias[0, top[:, 0]] = float("-inf")                     # suppress position 0's arg-max in both rows
    exact = F.linear(h, weight) + bias
    fast = ArgmaxProjection(weight, torch.zeros(300))(h, bias)
    assert torch.equal(fast.argmax(-1), exact.argmax(-1)) and not torch.equal(fast.argmax(-1)[:, 0], top[:, 0])
    assert torch.isinf(fast[:, 0, top[:, 0]]).all()


@pytest.mark.parametrize("view", ["model", "argmax"])
def test_a_step_with_valid_counts_computes_only_those_positions(tiny_decoder, view):
    model = tiny_decoder if view == "model" else tiny_decoder.argmax_view()
    x = features(3, seed=2)
    tokens = torch.tensor([[5, 12, 17, 23], [40, 41, 50, 0], [17, 23, 33, 5]])
    full_state = model.prefill(tiny_decoder.encode(x, PROMPT), 8)
    full = model.step(full_state, tokens)
    state = model.prefill(tiny_decoder.encode(x, PROMPT), 8)
    valid = torch.tensor([4, 0, 2])
    kept = model.step(state, tokens, valid=valid)
    assert kept.shape == full.shape and state.lengths.tolist() == full_state.lengths.tolist()
    for b, n in enumerate(valid.tolist()):
        torch.testing.assert_close(kept[b, :n], full[b, :n], atol=1e-5, rtol=1e-5)
        assert torch.equal(kept[b, :n].argmax(-1), full[b, :n].argmax(-1))
        filler = kept[b, n:]
        assert not filler[torch.isfinite(filler)].any()              # filler: no logits (zeros + suppression)
    # after rolling the filler back, the state decodes on like the full one
    state.rollback(4 - valid)
    full_state.rollback(4 - valid)
    nxt = torch.tensor([[7], [9], [11]])
    torch.testing.assert_close(model.step(state, nxt), model.step(full_state, nxt), atol=1e-5, rtol=1e-5)


def test_bad_valid_counts_are_named(tiny_decoder):
    state = tiny_decoder.prefill(tiny_decoder.encode(features(2), PROMPT), 8)
    tokens = torch.tensor([[5, 12], [40, 41]])
    with pytest.raises(InputError, match=r"valid must be a tensor \[2\]"):
        tiny_decoder.step(state, tokens, valid=torch.tensor([1]))
    with pytest.raises(InputError, match=r"valid counts must lie in \[0, 2\]"):
        tiny_decoder.step(state, tokens, valid=torch.tensor([3, 1]))


def test_an_int8_fixed_shape_model_gives_a_token_the_same_logits_in_any_pass(tiny_hf):
    """An int8 target's logits for a token are bitwise those of the one-token pass of that row alone: in a verify
    pass wider than a query block, beside other rows and in a ragged batch (greedy-identity by construction; in
    fp32 the linear layers' products round by the call's shape too)."""
    model = WhisperDecoderModel(tiny_hf, quantized=True, fixed_shape=True)
    audio = model.encode(features(3, seed=6), PROMPT)              # one encoder call: each row's states are the batch's
    tokens = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(3))
    alone = []
    for b in range(3):
        state = model.prefill(audio.select_rows(torch.tensor([b]), model.device), 12)
        rows = [state.logits] + [model.step(state, tokens[b:b + 1, t:t + 1])[:, 0] for t in range(10)]
        alone.append(torch.stack(rows, 1)[0])                              # [11, V]: after the prompt, then each token
    state = model.prefill(audio, 12)
    assert state.cache.capacity == model.max_positions and state.cache.full_width
    assert torch.equal(state.logits, torch.stack([a[0] for a in alone]))
    wide = model.step(state, tokens)
    assert all(torch.equal(wide[b], alone[b][1:]) for b in range(3))
    state.rollback(torch.tensor([6, 4, 8]))                                 # rows at 4, 6 and 2 tokens
    starts = [4, 6, 2]
    ragged = model.step(state, torch.stack([tokens[b, s:s + 4] for b, s in enumerate(starts)]))
    assert all(torch.equal(ragged[b], alone[b][s + 1:s + 5]) for b, s in enumerate(starts))
