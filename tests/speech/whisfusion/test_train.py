"""Whisfusion training pieces on a tiny random Whisper: masked batches, the loss learns, batches of
similar length, the canvas rate covers the windows."""

import torch

from mmaccel.speech.whisfusion.model import MASK, WhisfusionDecoder
from mmaccel.speech.whisfusion.train import masked_batch, masked_loss, similar_lengths, tokens_per_second
from tests.speech.conftest import EOT, PROMPT, tiny_whisper


def windows():
    gen = torch.Generator().manual_seed(0)
    return [{"states": torch.randn(20, 32, generator=gen).half(), "seconds": s,
             "tokens": torch.randint(0, 50, (n,), generator=gen, dtype=torch.int32)}
            for s, n in [(3.0, 4), (6.0, 9), (9.0, 12)]]


def test_masked_batches_mask_only_the_canvas_and_target_only_masked_positions():
    model = WhisfusionDecoder(tiny_whisper(), tokens_per_second=1.0, margin=2)
    ws = windows()
    tokens, targets, padding, states, cross_padding = masked_batch(model, ws, PROMPT, EOT, 0.0,
                                                                   torch.Generator().manual_seed(1))
    P = len(PROMPT)
    assert (tokens[:, :P] == torch.tensor(PROMPT)).all() and (targets[:, :P] == -100).all()
    masked = tokens == MASK
    assert ((targets != -100) == masked).all() and masked[:, P:].any(1).all()
    for b, w in enumerate(ws):
        L = max(model.canvas_length(w["seconds"], P), len(w["tokens"]) + 1)
        assert not padding[b, :P + L].any() and padding[b, P + L:].all()
        clean = torch.where(masked[b], targets[b], tokens[b])[P:P + L]
        assert clean[:len(w["tokens"])].tolist() == w["tokens"].tolist() and (clean[len(w["tokens"]):] == EOT).all()
        assert not masked[b, P + L:].any()
    assert states.dtype == torch.float32 and states.shape[:2] == cross_padding.shape
    full = masked_batch(model, ws, PROMPT, EOT, 1.0, torch.Generator().manual_seed(1))[0]
    assert ((full == MASK) == ~padding & (torch.arange(full.shape[1]) >= P)).all()


def test_the_masked_loss_learns_a_batch():
    torch.manual_seed(0)
    model = WhisfusionDecoder(tiny_whisper(), tokens_per_second=1.0, margin=2).train()
    params = list(model.trained_state().values())
    opt = torch.optim.Adam(params, lr=1e-2)
    batch = masked_batch(model, windows(), PROMPT, EOT, 0.5, torch.Generator().manual_seed(3))
    losses = []
    for _ in range(60):
        loss = masked_loss(model, *batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.6 * losses[0]          # the tied output embedding is frozen (and random here): slow but steady
    assert model.decoder.embed_tokens.weight.grad is None                    # frozen


def test_batches_hold_neighbours_by_length_and_the_rate_covers_the_windows():
    order = [4, 0, 3, 1, 2]
    for seed in range(5):
        pick = similar_lengths(order, 2, torch.Generator().manual_seed(seed))
        assert len(pick) == 2 and order.index(pick[1]) == order.index(pick[0]) + 1
    ws = windows()
    rate = tokens_per_second(ws, margin=2, quantile=1.0)
    model = WhisfusionDecoder(tiny_whisper(), tokens_per_second=rate, margin=2)
    assert all(model.canvas_length(w["seconds"], 0) >= len(w["tokens"]) + 1 for w in ws)
