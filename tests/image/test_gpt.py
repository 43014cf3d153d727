"""LlamaGen c2i GPT: official checkpoint layout, cached decoding == full forward, lossless methods with CFG."""

import argparse
import math

import pytest
import torch
from safetensors.torch import save_file

from mmaccel.core.methods import Resources, build_method
from mmaccel.core.model import append_ragged
from mmaccel.core.sampling import CFG
from mmaccel.core.speculative import LoopConfig, decode
from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.image.models.gpt import GPTConfig, LlamaGenGPT, gpt_config, load_gpt, rope_2d

V, C, GRID = 64, 10, 4
N = GRID * GRID


def tiny(seed: int, n_layer: int = 2, dim: int = 64, n_head: int = 4, **kw) -> LlamaGenGPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(dim=dim, n_layer=n_layer, n_head=n_head, vocab_size=V, num_classes=C, block_size=N,
                    multiple_of=32, **kw)
    model = LlamaGenGPT(cfg).eval()
    with torch.no_grad():  # the official init zeroes the head; give greedy clear winners instead
        model.output.weight.normal_(0, 0.5)
        model.cls_embedding.embedding_table.weight.normal_(0, 1.0)
        model.tok_embeddings.weight.normal_(0, 1.0)
    return model


@pytest.fixture(scope="module")
def model():
    return tiny(0)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, V, (3, N), generator=torch.Generator().manual_seed(1))


LABELS = [3, 7, C]  # the last row is the null (unconditional) class


# ---- (1) checkpoint containers -------------------------------------------------------------------

@pytest.mark.parametrize("container", ["ddp", "fsdp", "deepspeed", "state_dict", "safetensors", "in_memory"])
def test_official_containers_round_trip(model, tokens, tmp_path, container):
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    path = tmp_path / "ckpt.pt"
    if container == "safetensors":
        path = tmp_path / "ckpt.safetensors"
        save_file(sd, str(path))
    elif container == "in_memory":
        path = {"model": sd, "optimizer": {}, "steps": 10, "args": None}
    else:
        args = argparse.Namespace(gpt_model="GPT-nano", image_size=64, cls_token_num=1, ema=True)
        wrapped = {"ddp": {"model": sd, "optimizer": {}, "steps": 10, "args": args, "ema": sd}, "fsdp": sd,
                   "deepspeed": {"module": sd}, "state_dict": {"state_dict": sd}}[container]
        torch.save(wrapped, path)
    loaded = load_gpt(path, block_size=N)     # size inferred from the weights (dim 64, 2 layers -> GPT-nano)
    assert loaded.config.num_classes == C and loaded.config.vocab_size == V and loaded.config.n_head == 4
    with torch.no_grad():
        assert torch.equal(loaded(LABELS, tokens), model(LABELS, tokens))


def test_derived_buffers_and_prefixes_are_tolerated(model, tokens):
    sd = {"module." + k: v for k, v in model.state_dict().items()}
    sd["module.freqs_cis"] = torch.zeros(N + 1, 8, 2)          # older official code kept the rope table
    loaded = load_gpt({"model": sd}, model.config)
    with torch.no_grad():
        assert torch.equal(loaded(LABELS, tokens), model(LABELS, tokens))


# ---- (2) official names and shapes ----------------------------------------------------------------

def test_gpt_b_has_the_official_keys_and_shapes():
    cfg = gpt_config("GPT-B")
    assert (cfg.dim, cfg.n_layer, cfg.n_head, cfg.vocab_size, cfg.num_classes, cfg.block_size, cfg.cls_token_num,
            cfg.rope_base, cfg.norm_eps, cfg.multiple_of, cfg.class_dropout_prob) == \
        (768, 12, 12, 16384, 1000, 256, 1, 10000, 1e-5, 256, 0.1)
    with torch.device("meta"):
        sd = LlamaGenGPT(cfg).state_dict()
    shapes = {k: tuple(v.shape) for k, v in sd.items()}
    expected = {
        "cls_embedding.embedding_table.weight": (1001, 768),   # 1000 classes + the CFG null class
        "tok_embeddings.weight": (16384, 768),
        "layers.0.attention.wqkv.weight": (2304, 768),
        "layers.0.attention.wo.weight": (768, 768),
        "layers.0.feed_forward.w1.weight": (2048, 768),
        "layers.0.feed_forward.w3.weight": (2048, 768),
        "layers.0.feed_forward.w2.weight": (768, 2048),
        "layers.0.attention_norm.weight": (768,),
        "layers.0.ffn_norm.weight": (768,),
        "layers.11.ffn_norm.weight": (768,),
        "norm.weight": (768,),
        "output.weight": (16384, 768),
    }
    for key, shape in expected.items():
        assert shapes[key] == shape, key
    assert len(shapes) == 2 + 12 * 7 + 2 and "layers.12.ffn_norm.weight" not in shapes
    assert "freqs_cis" not in shapes                 # a plain attribute in the official model, not a buffer
    assert 110e6 < sum(math.prod(s) for s in shapes.values()) < 112e6     # "111M"
    for name, (layers, heads, dim) in {"GPT-L": (24, 16, 1024), "GPT-XL": (36, 20, 1280)}.items():
        c = gpt_config(name)
        assert (c.n_layer, c.n_head, c.dim) == (layers, heads, dim)


def test_rope_2d_is_row_then_column_in_raster_order():
    cfg = GPTConfig(dim=64, n_layer=1, n_head=4, block_size=N)          # head_dim 16: 4 row pairs, 4 column pairs
    pos = torch.arange(N + GRID)                                        # past the grid: extra rows
    got = rope_2d(pos, cfg)
    q = cfg.head_dim // 4
    freqs = [cfg.rope_base ** (-2 * j / (cfg.head_dim // 2)) for j in range(q)]
    for i in pos.tolist():
        r, c = divmod(i, GRID)
        angles = torch.tensor([r * f for f in freqs] + [c * f for f in freqs])
        want = torch.stack([angles.cos(), angles.sin()], -1)
        assert torch.allclose(got[i].double(), want.double(), atol=1e-6)


# ---- (3) cache == full forward --------------------------------------------------------------------

def test_cached_decoding_equals_full_forward_and_rollback(model, tokens):
    with torch.no_grad():
        full = model(LABELS, tokens)                      # [B, N + 1, V]
    assert full.shape == (3, N + 1, V)
    state = model.prefill(LABELS, N + 4)                               # + room for ragged padding
    assert (full[:, 0] - state.logits).abs().max() < 1e-4
    for i in range(0, N - 3, 1):                                       # one token at a time
        out = model.step(state, tokens[:, i : i + 1])
        assert (out[:, 0] - full[:, i + 1]).abs().max() < 1e-4
    out = model.step(state, tokens[:, N - 3 :])                        # then a block of 3
    assert (out - full[:, N - 2 :]).abs().max() < 1e-4

    # roll back 5, re-append different tokens, compare with the full forward of the new sequence
    state.rollback(5)
    new = tokens.clone()
    new[:, N - 5 :] = (tokens[:, N - 5 :] + 1) % V
    out = model.step(state, new[:, N - 5 :])
    with torch.no_grad():
        full_new = model(LABELS, new)
    assert (out - full_new[:, N - 4 :]).abs().max() < 1e-4

    # ragged rows: per-row rollback then different numbers of tokens per row
    state.rollback(torch.tensor([2, 4, 1]))
    rows = [new[0, N - 2 :], new[1, N - 4 :], new[2, N - 1 :]]
    last = append_ragged(model, state, rows)
    assert (last - full_new[:, N]).abs().max() < 1e-4


def test_tree_step_matches_full_forward_along_each_branch(model, tokens):
    # two siblings after a shared prefix: each must see the prefix but not the other
    state = model.prefill(LABELS[:2], N)
    model.step(state, tokens[:2, :5])
    branch = torch.stack([tokens[:2, 5], (tokens[:2, 5] + 7) % V], 1)  # [B, 2] both at image index 5
    out = model.step(state, branch, tree_mask=torch.eye(2, dtype=torch.bool)[None])
    for j in range(2):
        seq = torch.cat([tokens[:2, :5], branch[:, j : j + 1]], 1)
        with torch.no_grad():
            ref = model(LABELS[:2], seq)[:, -1]
        assert (out[:, j] - ref).abs().max() < 1e-4


# ---- (4) lossless methods with CFG ----------------------------------------------------------------

def perturbed_copy(model: LlamaGenGPT, seed: int, noise: float) -> LlamaGenGPT:
    """A draft that mostly agrees with `model`: its weights plus Gaussian noise."""
    draft = LlamaGenGPT(model.config).eval()
    draft.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std().clamp(min=1e-3))
    return draft


@pytest.mark.parametrize("name, params, draft_kind", [
    ("sjd", {"window": 4}, None),
    ("speculative", {"k": 3}, "small"),        # an unrelated smaller draft: nothing accepted, still exact
    ("speculative", {"k": 3}, "close"),        # a draft that mostly agrees: fewer target passes, still exact
])
def test_greedy_methods_with_cfg_match_ar(model, name, params, draft_kind):
    draft = {None: None, "small": tiny(5, n_layer=1, dim=32, n_head=2), "close": perturbed_copy(model, 2, 0.05)}[draft_kind]
    labels = [1, 4, 8]
    inputs = (labels, [C] * len(labels))
    res = Resources(model=CFG(model, 3.0), draft=None if draft is None else CFG(draft, 3.0))
    base = decode(res.model, inputs, LoopConfig(), max_new_tokens=N)
    out = decode(res.model, inputs, build_method(name, **params).loop_config(res), max_new_tokens=N)
    assert out.tokens == base.tokens
    assert all(len(r) == N for r in out.tokens)
    assert out.stats.nfe <= base.stats.nfe
    if draft_kind == "close":
        assert out.stats.nfe < base.stats.nfe
    plain = decode(model, labels, LoopConfig(), max_new_tokens=N)
    assert plain.tokens != base.tokens                                 # guidance changed the output


def test_early_exit_self_speculation_matches_ar(model):
    labels = [1, 4, 8]
    res = Resources(model=model)
    base = decode(model, labels, LoopConfig(), max_new_tokens=N)
    out = decode(model, labels, build_method("early-exit", k=3, exit_layer=1).loop_config(res), max_new_tokens=N)
    assert out.tokens == base.tokens
    with pytest.raises(InputError, match="exit layer"):
        model.early_exit(3)


# ---- (5) errors -----------------------------------------------------------------------------------

def test_input_errors(model, tokens, tmp_path):
    with pytest.raises(InputError, match="out of range"):
        model.prefill([C + 1], 4)
    with pytest.raises(InputError, match="out of range"):
        model.prefill([-1], 4)
    with pytest.raises(InputError, match="unknown label 'cat'"):
        model.prefill(["cat"], 4)
    with pytest.raises(InputError, match="empty"):
        model.prefill([], 4)
    state = model.prefill([1], 4)
    with pytest.raises(InputError, match=r"token ids must lie in \[0, 64\)"):
        model.step(state, torch.tensor([[V]]))
    with pytest.raises(InputError, match="longer than block_size"):
        model([1], torch.zeros(1, N + 1, dtype=torch.long))
    with pytest.raises(InputError, match="token ids"):
        model([1], torch.full((1, 3), -1))
    no_null = LlamaGenGPT(GPTConfig(dim=32, n_layer=1, n_head=2, vocab_size=V, num_classes=C, block_size=N,
                                    class_dropout_prob=0.0))
    with pytest.raises(InputError, match="no null class"):
        no_null.prefill([C], 4)
    with pytest.raises(InputError, match="block_size"):
        GPTConfig(block_size=250)


def test_checkpoint_errors(model, tmp_path):
    missing = tmp_path / "nope" / "c2i_B_256.pt"
    with pytest.raises(ModelNotFoundError, match="c2i_B_256.pt"):
        load_gpt(missing)
    corrupt = tmp_path / "bad.pt"
    corrupt.write_bytes(b"not a checkpoint at all")
    with pytest.raises(InputError) as err:
        load_gpt(corrupt)
    assert "bad.pt" in str(err.value) and "\n" not in str(err.value)
    sd = dict(model.state_dict())
    sd.pop("layers.1.attention.wo.weight")
    sd["layers.1.attention.extra.weight"] = torch.zeros(1)
    with pytest.raises(InputError, match=r"missing key\(s\), first: layers\.1\.attention\.wo\.weight.*"
                                         r"unexpected key\(s\), first: layers\.1\.attention\.extra\.weight"):
        load_gpt({"model": sd}, model.config)
    with pytest.raises(InputError, match=r"wrong shape .*first: cls_embedding\.embedding_table\.weight"):
        load_gpt({"model": dict(model.state_dict())}, model.config, num_classes=C + 1)
    with pytest.raises(InputError, match="unknown GPTConfig field"):
        load_gpt({"model": dict(model.state_dict())}, heads=4)
    with pytest.raises(InputError, match="not a LlamaGen"):
        load_gpt({"model": {"foo": torch.zeros(1)}})
