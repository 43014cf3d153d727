"""The Whisper draft decoder: built from target layers, exact against Hugging Face, shares the
target's cross-attention cache, speculative decoding with it equals greedy, trains, and its file."""

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from mmaccel.core.methods import Resources
from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech.draft import load_draft, new_draft, save_draft, trainable
from mmaccel.speech.methods import build_asr_method
from mmaccel.speech.train.draft import batches, cross_cache, distillation_loss, draft_hidden, training_parameters
from tests.speech.conftest import EOT, PROMPT, SUPPRESS, features, tiny_whisper

SHORTLIST = torch.tensor([0, 5, 12, 17, 23, 33, 40, 41, 50, EOT])


def _perturbed(tiny_hf, seed=3, std=0.05, layers=(0, -1)):
    draft = new_draft(tiny_hf, layers)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in trainable(draft).values():
            p.add_(torch.randn_like(p) * std)
    return draft


def test_draft_starts_as_the_target_layers_and_equals_hugging_face(tiny_hf, tiny_decoder):
    draft = new_draft(tiny_hf, (0, -1))
    assert draft.layers == [0, 3]
    src, mine = tiny_hf.model.decoder, draft.hf.model.decoder
    assert mine.embed_tokens is src.embed_tokens and draft.hf.proj_out.weight is src.embed_tokens.weight
    torch.testing.assert_close(mine.layers[1].fc1.weight, src.layers[3].fc1.weight, atol=0, rtol=0)
    assert not any("encoder_attn.k_proj" in n or "embed" in n for n in trainable(draft))

    x = features(2)
    ids = torch.tensor([PROMPT + [5, 9, 11], PROMPT + [4, 4, 20]])
    with torch.no_grad():
        encoded = tiny_hf.model.encoder(x).last_hidden_state
        ref = draft.hf(input_ids=ids, encoder_outputs=(encoded,)).logits
    dm = draft.decoder_model(tiny_decoder)
    state = dm.prefill(tiny_decoder.encode(x, PROMPT), 8)
    out = dm.step(state, ids[:, len(PROMPT):])
    want = ref[:, len(PROMPT):].clone()
    want[..., SUPPRESS] = float("-inf")
    torch.testing.assert_close(out, want, atol=2e-5, rtol=0)


def test_draft_reads_the_targets_cross_attention_cache(tiny_hf, tiny_decoder):
    dm = new_draft(tiny_hf, (1, 2)).decoder_model(tiny_decoder)
    inputs = tiny_decoder.encode(features(1), PROMPT)
    tiny_decoder.prefill(inputs, 4)
    shared = {k: v[0].data_ptr() for k, v in inputs.cross_kv.items()}
    dm.prefill(inputs, 4)
    assert {k: v[0].data_ptr() for k, v in inputs.cross_kv.items()} == shared   # nothing recomputed


@pytest.mark.parametrize("method,params,vocab", [
    ("speculative", {"k": 3}, None), ("speculative", {"k": 2}, SHORTLIST), ("tree", {"depth": 3, "width": 2}, None),
])
def test_speculative_with_the_draft_equals_greedy(tiny_hf, tiny_decoder, method, params, vocab):
    draft = _perturbed(tiny_hf, std=0.01, layers=(0, 1, 2, 3))     # a near copy: many drafts, not all, accepted
    draft.vocab = vocab
    resources = Resources(tiny_decoder, draft=draft.decoder_model(tiny_decoder))
    x = features(3, seed=11)
    greedy = build_asr_method("greedy").run(resources, tiny_decoder.encode(x, PROMPT), max_new_tokens=24, eos_token_id=EOT)
    fast = build_asr_method(method, **params).run(resources, tiny_decoder.encode(x, PROMPT), max_new_tokens=24,
                                                  eos_token_id=EOT)
    assert fast.tokens == greedy.tokens
    assert fast.stats.nfe < greedy.stats.nfe and 1 < fast.stats.mean_accepted
    assert len(fast.stats.accepted_hist) > 1                      # rows accepted different numbers of drafts


def test_speculative_without_a_draft_is_a_clear_error(tiny_decoder):
    with pytest.raises(InputError, match="needs a draft model"):
        build_asr_method("speculative").run(Resources(tiny_decoder), tiny_decoder.encode(features(1), PROMPT),
                                            max_new_tokens=4, eos_token_id=EOT)


def test_training_steps_raise_agreement_with_the_target(tiny_hf, tiny_decoder):
    x = features(8, seed=21)
    inputs = tiny_decoder.encode(x, PROMPT)
    greedy = build_asr_method("greedy").run(Resources(tiny_decoder), inputs, max_new_tokens=12, eos_token_id=EOT)
    rows = [{"tokens": torch.tensor(PROMPT + g), "prompt_len": len(PROMPT), "encoder": inputs.encoder_states[b]}
            for b, g in enumerate(greedy.tokens)]
    draft = _perturbed(tiny_hf, std=0.5)
    dm = draft.decoder_model(tiny_decoder)
    cross = cross_cache(dm, rows)
    weight = tiny_decoder.decoder.embed_tokens.weight.detach()
    idx, tokens, target = next(batches(rows, EOT, 8, torch.arange(8)))

    def agreement():
        with torch.no_grad():
            hidden = draft_hidden(dm, cross, tokens)
        keep = target >= 0
        return float((torch.nn.functional.linear(hidden[keep], weight).argmax(-1) == target[keep]).float().mean())

    final, _ = tiny_decoder.teacher_forced(inputs, tokens[:, len(PROMPT):])
    keep = target >= 0
    teacher = nn.functional.linear(final[keep], weight)          # the target's own logits: soft targets
    params = training_parameters(draft)
    opt = torch.optim.Adam(params, lr=3e-3)
    start = agreement()
    for _ in range(60):
        hidden = draft_hidden(dm, cross, tokens)
        loss = distillation_loss(nn.functional.linear(hidden[keep], weight), target[keep], teacher, kd=0.5)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert tiny_decoder.decoder.embed_tokens.weight.grad is None          # the shared embedding stays frozen
    assert agreement() > max(start, 0.9)
    assert float(distillation_loss(teacher, target[keep], teacher, kd=1.0)) < 1e-5    # no divergence from itself
    torch.testing.assert_close(distillation_loss(teacher, target[keep]), nn.functional.cross_entropy(teacher, target[keep]))


def test_draft_file_round_trip_and_bad_files(tiny_hf, tiny_decoder, tmp_path):
    draft = _perturbed(tiny_hf)
    draft.vocab = SHORTLIST
    draft.cross_window = 3
    path = save_draft(tmp_path / "draft.safetensors", tiny_hf, draft, {"note": "test"})
    back = load_draft(path, tiny_hf)
    assert back.layers == [0, 3] and back.vocab.tolist() == SHORTLIST.tolist() and back.cross_window == 3
    assert back.timestamps is False and back.decoder_model(tiny_decoder).reads_timestamps_as_none
    draft.timestamps = True                             # trained on timestamp-mode transcripts too
    back_timed = load_draft(save_draft(tmp_path / "timed.safetensors", tiny_hf, draft), tiny_hf)
    assert back_timed.timestamps is True and not back_timed.decoder_model(tiny_decoder).reads_timestamps_as_none
    for name, p in trainable(back).items():
        torch.testing.assert_close(p, trainable(draft)[name].half().float(), atol=0, rtol=0)
    with pytest.raises(ModelNotFoundError, match="draft decoder file not found"):
        load_draft(tmp_path / "missing.safetensors", tiny_hf)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(InputError, match="not a readable safetensors file"):
        load_draft(tmp_path / "junk.safetensors", tiny_hf)
    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(InputError, match="not a Whisper draft decoder file"):
        load_draft(tmp_path / "other.safetensors", tiny_hf)
    bigger = tiny_whisper()
    bigger.config.decoder_layers = 6
    with pytest.raises(InputError, match="holds a draft for a Whisper decoder with"):
        load_draft(path, bigger)


def test_bad_draft_layers_are_named(tiny_hf):
    with pytest.raises(InputError, match="draft layers must be distinct target layers"):
        new_draft(tiny_hf, (0, 0))
    with pytest.raises(InputError, match="draft layers must be distinct target layers"):
        new_draft(tiny_hf, (7,))


def test_cross_window_attends_to_each_rows_audio_frames_only(tiny_hf, tiny_decoder):
    x = features(2, seed=5)
    seconds = [0.1, 0.26]                        # of the tiny model's 0.4-s window: 5 and 13 of 20 frames
    draft = _perturbed(tiny_hf)
    draft.cross_window = 2
    dm = draft.decoder_model(tiny_decoder)
    inputs = tiny_decoder.encode(x, PROMPT, seconds)
    assert inputs.audio_frames.tolist() == [5, 13]
    ids = torch.tensor([[5, 9, 11], [4, 4, 20]])
    state = dm.prefill(inputs, 4)
    batched = dm.step(state, ids)
    # training sees what decoding sees: keys/values cut per row, padded, masked
    rows = [{"tokens": torch.tensor(PROMPT + ids[b].tolist()), "prompt_len": len(PROMPT),
             "encoder": inputs.encoder_states[b]} for b in range(2)]
    cross = cross_cache(dm, rows, [5, 13])
    assert [c[0][0].shape[1] for c in cross] == [7, 15]
    trained = draft_hidden(dm, cross, torch.stack([r["tokens"] for r in rows]))
    torch.testing.assert_close(trained[:, len(PROMPT):], state.hidden, atol=3e-3, rtol=0)   # fp16 cache
    with torch.no_grad():
        encoded = tiny_hf.model.encoder(x).last_hidden_state
    for b, frames in enumerate((7, 15)):         # audio frames + the window of 2: what HF sees when cut there
        ref = draft.hf(input_ids=torch.tensor([PROMPT + ids[b].tolist()]),
                       encoder_outputs=(encoded[b : b + 1, :frames],)).logits[0, len(PROMPT):]
        ref[..., SUPPRESS] = float("-inf")
        torch.testing.assert_close(batched[b], ref, atol=2e-5, rtol=0)
    # an int8 draft cuts the same windows, in the keys' own dtype (torch's CPU attention runs a
    # one-token query over bf16 keys/values several times slower)
    q8, cut = draft.decoder_model(tiny_decoder, quantized=True), tiny_decoder.encode(x, PROMPT, seconds)
    q8.step(q8.prefill(cut, 4), ids)
    assert len(cut.windows) == 2
    for key, (k, v, _mask) in cut.windows.items():
        assert torch.equal(k, inputs.windows[key][0]) and k.dtype == v.dtype == inputs.encoder_states.dtype
    # without audio lengths, or with a window past the end, the draft attends to the whole window
    whole = draft.decoder_model(tiny_decoder)
    whole.cross_window = None
    full = whole.step(whole.prefill(tiny_decoder.encode(x, PROMPT, seconds), 4), ids)
    wide = new_draft(tiny_hf, (0, -1), cross_window=20)
    for name, p in trainable(wide).items():
        p.data.copy_(trainable(draft)[name])
    wm = wide.decoder_model(tiny_decoder)
    torch.testing.assert_close(wm.step(wm.prefill(tiny_decoder.encode(x, PROMPT, seconds), 4), ids), full,
                               atol=1e-6, rtol=0)
    with pytest.raises(InputError, match="one length per row"):
        tiny_decoder.encode(x, PROMPT, [0.1])
    with pytest.raises(InputError, match="cross_window must be None or an int"):
        new_draft(tiny_hf, (0,), cross_window=-1)


def test_an_int8_draft_is_close_and_speculative_with_it_equals_greedy(tiny_hf, tiny_decoder):
    draft = _perturbed(tiny_hf, std=0.01, layers=(0, 1, 2, 3))
    draft.vocab = SHORTLIST
    exact, int8 = draft.decoder_model(tiny_decoder), draft.decoder_model(tiny_decoder, quantized=True)
    assert isinstance(draft.hf.model.decoder.layers[0].fc1, nn.Linear)        # the draft itself is untouched
    x = features(3, seed=11)
    ids = torch.tensor([[5, 12, 17]] * 3)
    a = exact.step(exact.prefill(tiny_decoder.encode(x, PROMPT), 4), ids)
    b = int8.step(int8.prefill(tiny_decoder.encode(x, PROMPT), 4), ids)
    keep = torch.isfinite(a)
    assert torch.equal(keep, torch.isfinite(b))
    assert float((a[keep] - b[keep]).norm() / a[keep].norm()) < 0.05 and not torch.equal(a, b)
    resources = Resources(tiny_decoder, draft=int8)
    greedy = build_asr_method("greedy").run(resources, tiny_decoder.encode(x, PROMPT), max_new_tokens=24, eos_token_id=EOT)
    fast = build_asr_method("speculative", k=3).run(resources, tiny_decoder.encode(x, PROMPT), max_new_tokens=24,
                                                     eos_token_id=EOT)
    assert fast.tokens == greedy.tokens and fast.stats.nfe < greedy.stats.nfe


def test_shortlist_step_is_step_at_the_shortlist_columns(tiny_hf, tiny_decoder):
    draft = _perturbed(tiny_hf, std=0.01, layers=(0, 2))
    draft.vocab = SHORTLIST[torch.randperm(len(SHORTLIST))]          # any order
    x = features(2, seed=5)
    ids = torch.tensor([[5, 12, 17], [9, 3, 30]])
    for model in (draft.decoder_model(tiny_decoder), draft.decoder_model(tiny_decoder, quantized=True)):
        assert torch.equal(model.shortlist, SHORTLIST.sort().values)
        full = model.step(model.prefill(tiny_decoder.encode(x, PROMPT), 4), ids)
        short = model.shortlist_step(model.prefill(tiny_decoder.encode(x, PROMPT), 4), ids)
        assert torch.equal(short, full[..., model.shortlist])
        outside = torch.ones(full.shape[-1], dtype=torch.bool)
        outside[model.shortlist] = False
        assert torch.isinf(full[..., outside]).all()
    assert tiny_decoder.shortlist is None
    with pytest.raises(InputError, match="needs a model that reads out through a shortlist"):
        tiny_decoder.shortlist_step(tiny_decoder.prefill(tiny_decoder.encode(x, PROMPT), 4), ids)


def test_a_confidence_stop_drafts_less_and_still_equals_greedy(tiny_hf, tiny_decoder):
    draft = _perturbed(tiny_hf, std=0.02, layers=(0, 1, 2))
    draft.vocab = SHORTLIST
    resources = Resources(tiny_decoder, draft=draft.decoder_model(tiny_decoder))
    x = features(3, seed=4)
    greedy = build_asr_method("greedy").run(resources, tiny_decoder.encode(x, PROMPT), max_new_tokens=24, eos_token_id=EOT)
    runs = {c: build_asr_method("speculative", k=6, stop_below=c).run(resources, tiny_decoder.encode(x, PROMPT),
                                                                      max_new_tokens=24, eos_token_id=EOT)
            for c in (0.0, 0.9)}
    assert all(r.tokens == greedy.tokens for r in runs.values())
    assert runs[0.9].stats.draft_passes < runs[0.0].stats.draft_passes
    with pytest.raises(InputError, match="stop_below must be in"):
        build_asr_method("speculative", stop_below=1.0)


def test_the_first_drafts_are_verified_by_the_prefill_pass(tiny_hf, tiny_decoder):
    """A draft equal to the target has every draft accepted: k drafts from the prompt, scored by the
    prefill, give k + 1 tokens in one target pass (one pass per k + 1 tokens after that)."""
    same = new_draft(tiny_hf, (0, 1, 2, 3))
    for model in (tiny_decoder, tiny_decoder.argmax_view()):
        resources = Resources(model, draft=same.decoder_model(tiny_decoder))
        x = features(2, seed=11)
        greedy = build_asr_method("greedy").run(resources, tiny_decoder.encode(x, PROMPT), max_new_tokens=8)
        fast = build_asr_method("speculative", k=3).run(resources, tiny_decoder.encode(x, PROMPT), max_new_tokens=8)
        assert fast.tokens == greedy.tokens and all(len(t) == 8 for t in greedy.tokens)
        assert fast.stats.nfe == 2 and fast.stats.accepted_hist == {4: 4}


def test_rows_that_end_in_the_prefill_block_wait_while_the_others_decode(tiny_hf, tiny_decoder):
    same = new_draft(tiny_hf, (0, 1, 2, 3))
    resources = Resources(tiny_decoder, draft=same.decoder_model(tiny_decoder))
    x = features(4, seed=0)
    def run(name, **kw):
        return build_asr_method(name, **kw).run(resources, tiny_decoder.encode(x, PROMPT),
                                                                  max_new_tokens=12, eos_token_id=17)
    greedy, fast = run("greedy"), run("speculative", k=4)
    lengths = [len(t) for t in greedy.tokens]
    assert max(lengths[2:]) <= 5 < min(lengths[:2])           # rows 2, 3 end within the first block (5 tokens)
    assert fast.tokens == greedy.tokens


def test_finished_rows_and_filler_drafts_are_skipped_and_output_equals_greedy(tiny_hf, tiny_decoder, monkeypatch):
    """At batch > 1 a chain goes on while any row is sure: the drafts after a row's first unsure one
    are filler. The verify pass computes neither those nor finished rows (plain greedy skips those
    too), and no row accepts filler."""
    draft = _perturbed(tiny_hf, std=0.01, layers=(0, 1, 2, 3))
    resources = Resources(tiny_decoder, draft=draft.decoder_model(tiny_decoder))
    x = features(4, seed=0)
    seen = []
    step = tiny_decoder.step

    def spy(state, tokens, positions=None, tree_mask=None, valid=None):
        if valid is not None:
            seen.append((tokens.shape[1], valid.tolist()))
        return step(state, tokens, positions, tree_mask, valid)

    monkeypatch.setattr(tiny_decoder, "step", spy)
    def run(name, **kw):
        return build_asr_method(name, **kw).run(resources, tiny_decoder.encode(x, PROMPT),
                                                                  max_new_tokens=16, eos_token_id=17)
    greedy = run("greedy")
    assert any(0 in valid for _, valid in seen)                   # greedy skips finished rows too
    seen.clear()
    fast = run("speculative", k=5, stop_below=0.033)    # the tiny model is unsure: top probabilities ~0.03
    assert fast.tokens == greedy.tokens
    assert any(0 < v < T for T, valid in seen for v in valid)     # a row's own chain ended early
    assert any(0 in valid for _, valid in seen)                   # a finished row rode along, uncomputed
    lengths = [len(t) for t in greedy.tokens]
    assert len(set(lengths)) > 1


def test_runner_up_siblings_of_unsure_drafts_are_verified_and_output_equals_greedy(tiny_hf, tiny_decoder, monkeypatch):
    """With `siblings`, a chain that ended on an unsure draft is verified as a tree with that
    draft's runner-ups beside it; a pass that accepts one gains a token. Filler nodes and finished
    rows are still left out of the products, and the transcripts equal greedy's."""
    import mmaccel.core.speculative as loop

    draft = _perturbed(tiny_hf, std=0.01, layers=(0, 1, 2, 3))
    resources = Resources(tiny_decoder, draft=draft.decoder_model(tiny_decoder))
    x = features(4, seed=0)
    through_sibling, valid_seen = [], []
    verify, step = loop.verify_tree_greedy, tiny_decoder.step

    def spy_verify(tree, logits):
        path, n, nxt = verify(tree, logits)
        last = path.gather(1, n[:, None])[:, 0]
        through_sibling.extend((last > 0) & (tree.parents.gather(1, last[:, None])[:, 0] != last - 1))
        return path, n, nxt

    def spy_step(state, tokens, positions=None, tree_mask=None, valid=None):
        if tree_mask is not None and valid is not None:
            valid_seen.append((tokens.shape[1], valid.tolist()))
        return step(state, tokens, positions, tree_mask, valid)

    monkeypatch.setattr(loop, "verify_tree_greedy", spy_verify)
    monkeypatch.setattr(tiny_decoder, "step", spy_step)
    def run(name, **kw):
        return build_asr_method(name, **kw).run(resources, tiny_decoder.encode(x, PROMPT),
                                                                  max_new_tokens=16, eos_token_id=17)
    greedy = run("greedy")
    chain = run("speculative", k=5, stop_below=0.033)
    fast = run("speculative", k=5, stop_below=0.033, siblings=3)
    assert fast.tokens == greedy.tokens
    assert any(through_sibling)                                     # a runner-up was the target's token
    assert fast.stats.nfe < chain.stats.nfe
    assert any(0 < v < T for T, valid in valid_seen for v in valid)  # filler nodes left out
    assert any(0 in valid for _, valid in valid_seen)                # a finished row rode along, uncomputed
