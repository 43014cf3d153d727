"""SmolLM2 loading (offline, cached atomically) and the shipped distilled draft."""

import json

import pytest
import torch
from safetensors import safe_open
from transformers import LlamaConfig, LlamaForCausalLM

from mmaccel.errors import InputError, MMAccelError, ModelNotFoundError
from mmaccel.lm import smollm2
from mmaccel.lm.smollm2 import (
    CACHE_MARKER,
    CACHE_NAME,
    PIP_INSTALL,
    assets_dir,
    convert_smollm2,
    file_sha256,
    load_hf_causal_lm,
    load_smollm2,
    load_smollm2_draft,
)
from mmaccel.paths import default_cache_dir

DRAFT = assets_dir() / "smollm2_draft.safetensors"


def draft_meta() -> dict:
    return json.loads(DRAFT.with_suffix(".json").read_text())


def fake_target(**overrides) -> LlamaForCausalLM:
    """A random 1-layer Llama with SmolLM2's shapes (the draft only needs its embedding/lm_head)."""
    shapes = dict(draft_meta()["target_shapes"])
    shapes.update(overrides)
    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=1, tie_word_embeddings=True, rope_theta=100000.0, **shapes)
    return LlamaForCausalLM(cfg).eval()


def smollm2_installed() -> bool:
    try:
        smollm2.find_smollm2_gguf()
        return True
    except ModelNotFoundError:
        return (default_cache_dir() / CACHE_NAME / CACHE_MARKER).is_file()


# ---------------------------------------------------------------------------------------------
# errors


def test_load_hf_causal_lm_missing_path(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match="does not exist") as info:
        load_hf_causal_lm(missing)
    assert str(missing) in str(info.value)
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, MMAccelError)


def test_load_hf_causal_lm_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_hf_causal_lm(tmp_path)


def test_load_smollm2_without_package_names_pip_command(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError) as info:
        load_smollm2(cache_dir=tmp_path)
    message = str(info.value)
    assert PIP_INSTALL in message and "\n" not in message


# ---------------------------------------------------------------------------------------------
# cache


class _StubTokenizer:
    chat_template = None

    def __init__(self, fail: bool = False):
        self.fail = fail

    def save_pretrained(self, path):
        if self.fail:
            raise KeyboardInterrupt  # the user pressing Ctrl-C in the middle of the write
        (path / "tokenizer_config.json").write_text("{}")


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(cfg).eval()


def _stub_gguf_loading(monkeypatch, tokenizer):
    import transformers

    tiny = _tiny_llama()
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    real = transformers.AutoModelForCausalLM.from_pretrained
    # the GGUF read returns the tiny model; reading the written cache goes through the real loader
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda path, *a, **k: tiny if "gguf_file" in k else real(path, *a, **k))
    return tiny


def test_interrupted_conversion_leaves_no_cache(tmp_path, monkeypatch):
    _stub_gguf_loading(monkeypatch, _StubTokenizer(fail=True))
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"gguf")
    dest = tmp_path / "cache" / CACHE_NAME
    with pytest.raises(KeyboardInterrupt):
        convert_smollm2(gguf, dest)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []  # no temporary directory left either


def test_cache_is_used_without_package_and_incomplete_cache_is_discarded(tmp_path, monkeypatch):
    tiny = _stub_gguf_loading(monkeypatch, _StubTokenizer())
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"gguf")
    dest = tmp_path / CACHE_NAME
    convert_smollm2(gguf, dest)
    assert (dest / CACHE_MARKER).is_file() and (dest / "config.json").is_file()

    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)  # package gone
    model, _ = load_smollm2(cache_dir=tmp_path)
    torch.testing.assert_close(model.lm_head.weight, tiny.lm_head.weight)

    (dest / CACHE_MARKER).unlink()  # as if a copy without the marker had been put there by hand
    with pytest.raises(ModelNotFoundError, match="no converted copy"):
        load_smollm2(cache_dir=tmp_path)
    assert not dest.exists()


# ---------------------------------------------------------------------------------------------
# draft asset


def test_draft_asset_matches_its_config():
    meta = draft_meta()
    s = meta["target_shapes"]
    d, inter, kv = s["hidden_size"], s["intermediate_size"], s["num_key_value_heads"] * s["head_dim"]
    per_layer = {
        "self_attn.q_proj.weight": (s["num_attention_heads"] * s["head_dim"], d),
        "self_attn.k_proj.weight": (kv, d),
        "self_attn.v_proj.weight": (kv, d),
        "self_attn.o_proj.weight": (d, s["num_attention_heads"] * s["head_dim"]),
        "mlp.gate_proj.weight": (inter, d),
        "mlp.up_proj.weight": (inter, d),
        "mlp.down_proj.weight": (d, inter),
        "input_layernorm.weight": (d,),
        "post_attention_layernorm.weight": (d,),
    }
    expected = {f"model.layers.{i}.{k}": v for i in range(meta["num_hidden_layers"]) for k, v in per_layer.items()}
    expected["model.norm.weight"] = (d,)
    with safe_open(str(DRAFT), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert shapes == expected  # and so no embedding / lm_head inside
    assert dtypes == {"F16"} and meta["dtype"] == "float16"
    assert DRAFT.stat().st_size < 18e6
    assert file_sha256(DRAFT) == meta["sha256"]


def test_draft_shares_the_target_embedding_and_head():
    target = fake_target()
    draft = load_smollm2_draft(target)
    assert len(draft.model.layers) == draft_meta()["num_hidden_layers"]
    assert draft.model.embed_tokens is target.model.embed_tokens
    assert draft.lm_head.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    assert draft.model.norm.weight.dtype == torch.float32  # takes the target's dtype
    with safe_open(str(DRAFT), "pt") as f:
        torch.testing.assert_close(draft.model.layers[0].mlp.up_proj.weight,
                                   f.get_tensor("model.layers.0.mlp.up_proj.weight").float())
    with torch.inference_mode():
        logits = draft(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, target.config.vocab_size) and torch.isfinite(logits).all()


def test_draft_rejects_a_target_of_another_shape():
    with pytest.raises(InputError, match="hidden_size"):
        load_smollm2_draft(fake_target(hidden_size=64, intermediate_size=128, num_attention_heads=1, head_dim=64,
                                       num_key_value_heads=1))


def test_missing_draft_file_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="train_draft"):
        load_smollm2_draft(fake_target(), tmp_path / "nothing.safetensors")


# ---------------------------------------------------------------------------------------------
# the real model (conversion ~40 s the first time, ~5 s from the cache)


@pytest.fixture(scope="module")
def real_smollm2():
    if not smollm2_installed():
        pytest.skip(f"SmolLM2 not installed: {PIP_INSTALL}")
    torch.manual_seed(0)
    return load_smollm2()


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france(real_smollm2):
    model, tokenizer = real_smollm2
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])


@pytest.mark.slow
def test_render_prompt_uses_the_chat_template(real_smollm2):
    _, tokenizer = real_smollm2
    text = tokenizer.decode(smollm2.render_prompt(tokenizer, "Hello?"))
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nHello?<|im_end|>\n"
                                                                     "<|im_start|>assistant\n")


@pytest.mark.slow
def test_distilled_draft_is_accepted_and_lossless(real_smollm2):
    from mmaccel.lm.train_draft import greedy_speculative

    model, tokenizer = real_smollm2
    draft = load_smollm2_draft(model)
    ids = smollm2.render_prompt(tokenizer, "Why do leaves change colour in autumn?")
    with torch.inference_mode():
        reference = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids):].tolist()
    new, _, accepted = greedy_speculative(model, draft, ids, k=4, max_new_tokens=32, eos=tokenizer.eos_token_id)
    assert new == reference
    # held-out mean is 1.40 tokens per verify step; the untrained truncation gets 1.04
    assert sum(a + 1 for a in accepted) / len(accepted) > 1.15
