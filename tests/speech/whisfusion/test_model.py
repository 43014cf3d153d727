"""WhisfusionDecoder on a tiny random Whisper: the port equals Whisper's decoder under its causal mask,
masked positions read the [MASK] embedding, frozen tensors stay out of training and files, files round-trip."""

import json

import pytest
import torch

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech.whisfusion.model import CONFIG_FILE, MASK, WEIGHTS_FILE, WhisfusionDecoder
from tests.speech.conftest import EOT, PROMPT, features, tiny_whisper


def states(whisper, batch=2):
    with torch.no_grad():
        return whisper.model.encoder(features(batch)).last_hidden_state


def test_under_a_causal_mask_the_port_is_whispers_decoder():
    whisper = tiny_whisper()
    model = WhisfusionDecoder(whisper)
    enc = states(whisper)
    ids = torch.tensor([PROMPT + [5, 9, 11, 2], PROMPT + [7, 7, 1, 30]])
    with torch.no_grad():
        want = whisper(encoder_outputs=(enc,), decoder_input_ids=ids).logits
        got = model.logits(model.hidden(ids, model.cross_kv(enc), causal=True))
        bidirectional = model(ids, enc)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(bidirectional[:, :-1], want[:, :-1], atol=1e-3)     # later tokens are seen


def test_masked_positions_read_the_mask_embedding_and_padding_is_not_attended():
    whisper = tiny_whisper()
    model = WhisfusionDecoder(whisper)
    enc = states(whisper, 1)
    a = torch.tensor([PROMPT + [MASK, 9, MASK, EOT]])
    with torch.no_grad():
        out = model(a, enc)
        padded = model(torch.cat([a, torch.tensor([[3, 4]])], 1), enc,
                       key_padding=torch.tensor([[False] * 6 + [True, True]]))
        model.mask_embedding.data.add_(1.0)
        moved = model(a, enc)
    torch.testing.assert_close(padded[:, :6], out, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(moved, out)


def test_cross_attention_reads_the_audio_frames_plus_a_margin():
    model = WhisfusionDecoder(tiny_whisper(), cross_margin=2)
    fps = model.frames_per_second                                    # 20 states per 30 s for the tiny model
    assert model.audio_frames(0.0, 20) == 2 and model.audio_frames(100.0, 20) == 20
    assert model.audio_frames(15.0, 20) == int(-(-15 * fps // 1)) + 2
    enc = torch.randn(2, 20, 32)
    cut, padding = model.cut_states(enc, [0.0, 15.0])
    assert cut.shape[1] == padding.shape[1] == model.audio_frames(15.0, 20)
    assert padding[0].sum() == cut.shape[1] - 2 and not padding[1].any()


def test_canvas_length_follows_the_audio_within_the_target_positions():
    model = WhisfusionDecoder(tiny_whisper(), tokens_per_second=4.0, margin=3)
    assert model.canvas_length(0.0, 2) == 3 and model.canvas_length(2.0, 2) == 11
    assert model.canvas_length(1000.0, 2) == 48 - 2                    # max_target_positions
    assert model.canvas_length(5.0, 2) > model.canvas_length(4.0, 2)


def test_frozen_tensors_take_no_gradient_and_are_not_saved(tmp_path):
    whisper = tiny_whisper()
    model = WhisfusionDecoder(whisper, tokens_per_second=3.5)
    trained = model.trained_state()
    assert "decoder.embed_tokens.weight" not in trained and "mask_embedding" in trained
    assert not any("encoder_attn.k_proj" in k or "encoder_attn.v_proj" in k for k in trained)
    assert any("encoder_attn.q_proj" in k for k in trained) and all(p.requires_grad for p in trained.values())
    with torch.no_grad():
        model.mask_embedding.add_(0.5)
        model.decoder.layers[0].fc1.weight.mul_(1.5)
    model.save(tmp_path / "wf", "tiny", {"steps": 1})
    loaded = WhisfusionDecoder.load(tmp_path / "wf", tiny_whisper())
    assert loaded.tokens_per_second == 3.5 and loaded.cross_margin == model.cross_margin
    ids, enc = torch.tensor([PROMPT + [MASK, 4, MASK]]), states(whisper, 1)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, enc), model(ids, enc), rtol=2e-3, atol=2e-3)   # fp16 files


def test_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(ModelNotFoundError, match="holds no Whisfusion decoder"):
        WhisfusionDecoder.load(tmp_path, tiny_whisper())
    WhisfusionDecoder(tiny_whisper()).save(tmp_path / "wf", "tiny")
    (tmp_path / "wf" / CONFIG_FILE).write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        WhisfusionDecoder.load(tmp_path / "wf", tiny_whisper())
    WhisfusionDecoder(tiny_whisper()).save(tmp_path / "wf", "tiny")
    (tmp_path / "wf" / WEIGHTS_FILE).write_bytes(b"garbage")
    with pytest.raises(ModelNotFoundError, match="unreadable Whisfusion weights"):
        WhisfusionDecoder.load(tmp_path / "wf", tiny_whisper())
    WhisfusionDecoder(tiny_whisper()).save(tmp_path / "wf", "tiny")
    other = tiny_whisper()
    other.model.decoder.layers = other.model.decoder.layers[:2]
    with pytest.raises(InputError, match="does not fit"):
        WhisfusionDecoder.load(tmp_path / "wf", other)
    config = json.loads((tmp_path / "wf" / CONFIG_FILE).read_text())
    (tmp_path / "wf" / CONFIG_FILE).write_text(json.dumps({**config, "format": "other"}))
    with pytest.raises(InputError, match="format 'other'"):
        WhisfusionDecoder.load(tmp_path / "wf", tiny_whisper())
    with pytest.raises(InputError, match="not a Whisper encoder-decoder"):
        WhisfusionDecoder(torch.nn.Linear(2, 2))
