"""WhisperCTC on a tiny random Whisper: the variable-length encoder equals Hugging Face's, padding and
batching change nothing, heads save and load, and incremental early exit equals the offline rule."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech.audio import Audio
from mmaccel.speech.ctc.early_exit import early_exit, utterance_confidence
from mmaccel.speech.ctc.whisper_ctc import (
    CHARACTERS,
    CTCHead,
    WhisperCTC,
    character_vocab,
    default_exit_layers,
    encode_variable,
    log_mel_variable,
    normalize_text,
)
from tests.speech.conftest import features, tiny_whisper

MELS = 8
LENGTHS = (2300, 6000, 3100, 4800, 5500, 2700)   # samples: 14..37 mel frames, within the tiny model's 40


@pytest.fixture(scope="module")
def bundle():
    return SimpleNamespace(model=tiny_whisper(), feature_extractor=WhisperFeatureExtractor(feature_size=MELS),
                           name="tiny-test")


@pytest.fixture(scope="module", params=[1, 2], ids=["stride1", "stride2"])
def ctc(bundle, request):
    torch.manual_seed(0)
    model = WhisperCTC(bundle, width=32, heads=2, layers=1, dropout=0.0, stride=request.param,
                       source="tiny-test").eval()
    with torch.no_grad():                        # spread the heads' confidence so utterances differ in it
        for head in model.heads.values():
            head.out.weight.mul_(8)
    return model


def clips(lengths=LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    return [Audio((0.1 * rng.standard_normal(n) * np.sin(np.arange(n) / (50 + 30 * i))).astype(np.float32))
            for i, n in enumerate(lengths)]


def test_characters_and_normalization():
    vocab = character_vocab()
    assert len(CHARACTERS) == 29 and vocab.tokens[0] == "_" and vocab.blank == 0 and vocab.space == 1
    assert normalize_text("Don't-stop, the  Café\u2019s 3 cats!\nRock/roll") == "don't stop the cafe's cats rock roll"
    assert vocab.encode(normalize_text("Hi there")) == [9, 10, 1, 21, 9, 6, 19, 6]
    assert default_exit_layers(6) == (2, 4, 6) and default_exit_layers(2) == (1, 2) and default_exit_layers(4) == (2, 4)


def test_encode_variable_equals_hf_encoder():
    model = tiny_whisper()
    encoder = model.get_encoder()
    x = features(2)                                                      # [2, 8, 40]: the full window
    with torch.no_grad():
        ref = encoder(x, output_hidden_states=True)
        out, lengths = encode_variable(encoder, x, torch.tensor([40, 40]), (1, 2))
    assert lengths.tolist() == [20, 20]
    torch.testing.assert_close(out[2], ref.last_hidden_state, atol=1e-5, rtol=0)
    torch.testing.assert_close(out[1], ref.hidden_states[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("short", [26, 25])
def test_encode_variable_padded_row_equals_row_alone(short):
    encoder = tiny_whisper().get_encoder()
    x = features(2, seed=3)
    x[1, :, short:] = 5.0                                                # padding must not leak in
    with torch.no_grad():
        batch, lengths = encode_variable(encoder, x, torch.tensor([40, short]), (1, 2))
        width = short + short % 2
        alone, alone_len = encode_variable(encoder, x[1:, :, :width], torch.tensor([short]), (1, 2))
    n = (short + 1) // 2
    assert lengths.tolist() == [20, n] and alone_len.tolist() == [n]
    for k in (1, 2):
        torch.testing.assert_close(batch[k][1, :n], alone[k][0, :n], atol=1e-5, rtol=0)


def test_encode_variable_errors():
    encoder = tiny_whisper().get_encoder()
    with pytest.raises(InputError, match="even"):
        encode_variable(encoder, features(1)[..., :39], torch.tensor([39]), (2,))
    with pytest.raises(InputError, match="max_source_positions 20"):
        encode_variable(encoder, torch.zeros(1, MELS, 42), torch.tensor([42]), (2,))
    with pytest.raises(InputError, match="1..2"):
        encode_variable(encoder, features(1), torch.tensor([40]), (3,))
    with pytest.raises(InputError, match="mel bins"):
        encode_variable(encoder, torch.zeros(1, 80, 40), torch.tensor([40]), (2,))


def test_log_mel_variable_matches_30s_features():
    fe = WhisperFeatureExtractor(feature_size=MELS)
    audios = clips((5000, 6100))
    feats, frames = log_mel_variable(fe, audios)
    assert frames.tolist() == [31, 38] and feats.shape == (2, MELS, 38)
    full = fe([a.samples for a in audios], sampling_rate=16000, return_tensors="pt")["input_features"]
    for b, n in enumerate(frames.tolist()):
        # the clip's frames, and the padding (log-mel of silence), are those of its 30 s window
        torch.testing.assert_close(feats[b, :, :n - 2], full[b, :, :n - 2], atol=1e-4, rtol=0)
        torch.testing.assert_close(feats[b, :, n + 2:], full[b, :, n + 2:38], atol=1e-4, rtol=0)
    odd, n_odd = log_mel_variable(fe, clips((4950,)))                    # 30 frames, even already; 31 -> 32
    assert n_odd.tolist() == [30] and odd.shape[-1] == 30
    assert log_mel_variable(fe, clips((5000,)))[0].shape[-1] == 32
    with pytest.raises(InputError, match="longer than Whisper's 30 s"):
        log_mel_variable(fe, [Audio(np.zeros(16000 * 31, dtype=np.float32))])
    with pytest.raises(InputError, match="shorter than one"):
        log_mel_variable(fe, [Audio(np.zeros(300, dtype=np.float32))])


@pytest.mark.parametrize("stride", [1, 2, 3])
def test_ctc_head_shapes_and_padding(stride):
    torch.manual_seed(0)
    head = CTCHead(32, 29, width=16, heads=2, layers=2, stride=stride).eval()
    hidden = torch.randn(3, 12, 32)
    lengths = torch.tensor([12, 7, 9])
    with torch.no_grad():
        logits = head(hidden, lengths)
        alone = head(hidden[1:2, :7], torch.tensor([7]))
        garbage = head(torch.cat([hidden[1:2, :7], 100 * torch.randn(1, 5, 32)], 1), torch.tensor([7]))
    n = -(-7 // stride)
    assert logits.shape == (3, -(-12 // stride), 29) \
        and head.out_lengths(lengths).tolist() == [-(-x // stride) for x in (12, 7, 9)]
    torch.testing.assert_close(logits[1, :n], alone[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(garbage[0, :n], alone[0], atol=1e-5, rtol=0)     # frames past the length are not read
    with pytest.raises(InputError, match="stride must be an int >= 1"):
        CTCHead(32, 29, stride=0)


def test_log_probs_normalised_and_per_layer(ctc):
    audios = clips()
    lp, lengths = ctc.log_probs(audios)
    frames = torch.tensor([n // 160 for n in LENGTHS])
    stride = ctc.head_config["stride"]
    assert lengths.tolist() == ((frames + 1) // 2 + stride - 1).div(stride, rounding_mode="floor").tolist()
    assert lp.shape == (6, -(-19 // stride), 29) and ctc.frame_seconds == pytest.approx(0.02 * stride)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(lp[b, :n].logsumexp(-1), torch.zeros(n), atol=1e-5, rtol=0)
        assert bool((lp[b, n:] == 0).all())
    every = ctc.log_probs_all(audios)
    assert sorted(every) == [1, 2]
    torch.testing.assert_close(every[2][0], lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ctc.log_probs(audios, exit_layer=1)[0], every[1][0], atol=1e-5, rtol=0)
    alone, _ = ctc.log_probs(audios[:1])                                  # batching changes nothing
    n = int(lengths[0])
    torch.testing.assert_close(alone[0, :n], lp[0, :n], atol=1e-5, rtol=0)
    with pytest.raises(InputError, match="no head at layer 3"):
        ctc.log_probs(audios, exit_layer=3)
    with pytest.raises(InputError, match="longer than Whisper's 30 s"):
        ctc.log_probs([Audio(np.zeros(16000 * 31, dtype=np.float32))])
    with pytest.raises(InputError, match="max_source_positions"):       # 1 s = 50 positions > 20
        ctc.log_probs([Audio(np.zeros(16000, dtype=np.float32))])


@pytest.mark.parametrize("criterion", ["entropy", "max-prob"])
def test_transcribe_early_exit_equals_offline_rule(ctc, criterion):
    audios = clips()
    every = ctc.log_probs_all(audios)
    lengths = every[1][1]
    scores = utterance_confidence(every[1][0], lengths, criterion)
    threshold = float(scores.median())
    offline = early_exit({k: lp for k, (lp, _) in every.items()}, lengths, criterion, threshold)
    online = ctc.transcribe_early_exit(audios, criterion, threshold)
    assert set(offline.layers.tolist()) == {1, 2}                         # some rows exit early, some do not
    assert online.layers.tolist() == offline.layers.tolist()
    assert online.lengths.tolist() == lengths.tolist()
    torch.testing.assert_close(online.log_probs, offline.log_probs, atol=1e-5, rtol=0)


def test_save_load_round_trip(ctc, bundle, tmp_path):
    with torch.no_grad():                          # stored in fp16: round first so outputs compare exactly
        for p in ctc.heads.parameters():
            p.copy_(p.half().float())
    ctc.save(tmp_path / "m", info={"steps": 3})
    meta = json.loads((tmp_path / "m" / "ctc.json").read_text())
    assert meta["format"] == "mmaccel-whisper-ctc" and meta["whisper"] == "tiny-test" and meta["exit_layers"] == [1, 2]
    assert meta["head"] == {"width": 32, "heads": 2, "layers": 1, "dropout": 0.0, "stride": ctc.head_config["stride"]}
    assert len(meta["tokens"]) == 29 and meta["frame_seconds"] == pytest.approx(ctc.frame_seconds)
    loaded = WhisperCTC.load(tmp_path / "m", whisper=bundle)
    assert loaded.info == {"steps": 3} and loaded.exit_layers == (1, 2) and loaded.source == "tiny-test"
    audios = clips()[:3]
    torch.testing.assert_close(loaded.log_probs(audios)[0], ctc.log_probs(audios)[0], atol=1e-5, rtol=0)


def test_load_errors(ctc, bundle, tmp_path):
    with pytest.raises(ModelNotFoundError, match="ctc.json missing"):
        WhisperCTC.load(tmp_path / "nothing", whisper=bundle)
    root = ctc.save(tmp_path / "m")
    config = (root / "ctc.json").read_text()
    (root / "ctc.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        WhisperCTC.load(root, whisper=bundle)
    (root / "ctc.json").write_text(json.dumps({**json.loads(config), "format": "something-else"}))
    with pytest.raises(InputError, match="not a mmaccel-whisper-ctc file"):
        WhisperCTC.load(root, whisper=bundle)
    (root / "ctc.json").write_text(config)
    weights = (root / "ctc_heads.safetensors").read_bytes()
    (root / "ctc_heads.safetensors").write_bytes(b"garbage")
    with pytest.raises(InputError, match="not a readable safetensors"):
        WhisperCTC.load(root, whisper=bundle)
    (root / "ctc_heads.safetensors").unlink()
    with pytest.raises(ModelNotFoundError, match="no ctc_heads.safetensors"):
        WhisperCTC.load(root, whisper=bundle)
    (root / "ctc_heads.safetensors").write_bytes(weights)
    cfg = WhisperConfig(num_mel_bins=MELS, d_model=48, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, vocab_size=64,
                        max_source_positions=20, max_target_positions=8, pad_token_id=60,
                        bos_token_id=60, eos_token_id=60, decoder_start_token_id=61)
    wide = SimpleNamespace(model=WhisperForConditionalGeneration(cfg), feature_extractor=bundle.feature_extractor,
                           name="wide")
    with pytest.raises(InputError, match="d_model 32 .*d_model 48"):
        WhisperCTC.load(root, whisper=wide)
    with pytest.raises(InputError, match="exit layers must be in 1..2"):
        WhisperCTC(bundle, (1, 3))
