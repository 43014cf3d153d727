"""ImagePipeline: every image method with and without CFG, exactness of the lossless ones, budget-0
reductions of the relaxed ones, loading, and input errors."""

import pytest
import torch

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.image.methods import IMAGE_REGISTRY, build_image_method
from mmaccel.image.models.gpt import GPTConfig, LlamaGenGPT, save_gpt
from mmaccel.image.pipeline import ImagePipeline
from mmaccel.image.tokenizers.vq import VQConfig, VQModel, save_vq

V, C, GRID = 64, 10, 4
PARAMS = {"speculative": {"k": 3}, "tree": {"depth": 2, "width": 2}, "sjd": {"window": 3},
          "sjd-coupled": {"window": 3}, "lantern": {"k": 3, "neighbours": 8, "delta": 0.2},
          "gsd": {"window": 3, "p_threshold": 0.3, "d_threshold": 4.0}, "zipar": {"s": 2, "window": 1},
          "early-exit": {"k": 2, "exit_layer": 1}, "sjd2": {"window": 3, "steps": 2}}


def tiny_gpt(seed, n_layer=2, dim=64, n_head=4):
    torch.manual_seed(seed)
    m = LlamaGenGPT(GPTConfig(dim=dim, n_layer=n_layer, n_head=n_head, vocab_size=V, num_classes=C,
                              block_size=GRID * GRID, multiple_of=32)).eval()
    with torch.no_grad():
        m.output.weight.normal_(0, 0.3)
        m.cls_embedding.embedding_table.weight.normal_(0, 1.0)
        m.tok_embeddings.weight.normal_(0, 1.0)
    return m


@pytest.fixture(scope="module")
def pipe():
    torch.manual_seed(0)
    vq = VQModel(VQConfig(codebook_size=V, codebook_embed_dim=8, ch=16, ch_mult=(1, 2, 2), num_res_blocks=1,
                          z_channels=16, norm_groups=8))
    target = tiny_gpt(0)
    draft = LlamaGenGPT(target.config).eval()                       # a close drafter: target + small noise
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.05 * p.std().clamp(min=1e-3) * torch.randn(p.shape))
    return ImagePipeline(target, vq, draft, class_names=[f"c{i}" for i in range(C)])


@pytest.mark.parametrize("name", list(IMAGE_REGISTRY))
@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_every_method_generates_images(pipe, name, cfg_scale):
    out = pipe.generate([0, 5], name, cfg_scale=cfg_scale, seed=1, **PARAMS.get(name, {}))
    assert out.tokens.shape == (2, GRID, GRID) and len(out.images) == 2
    assert out.images[0].size == (16, 16)
    assert out.stats.nfe >= 2 and out.stats.new_tokens == 2 * GRID * GRID


@pytest.mark.parametrize("name", ["speculative", "tree", "sjd", "sjd-coupled", "early-exit", "sjd2"])
def test_lossless_methods_with_cfg_equal_greedy_ar(pipe, name):
    base = pipe.generate([1, 2, 3], "ar", cfg_scale=2.5, temperature=0)
    out = pipe.generate([1, 2, 3], name, cfg_scale=2.5, temperature=0, **PARAMS[name])
    assert torch.equal(out.tokens, base.tokens)
    assert out.stats.nfe <= base.stats.nfe


def test_builtin_sjd2_model_ships_beside_the_original():
    original = ImagePipeline.from_pretrained("builtin:fashion-mnist", draft=None)
    tuned = ImagePipeline.from_pretrained("builtin:fashion-mnist-sjd2", draft=None)
    assert tuned.model.config == original.model.config and tuned.model.dtype == torch.float32
    assert not torch.equal(tuned.model.tok_embeddings.weight, original.model.tok_embeddings.weight)
    base = tuned.generate([3, 7], "ar", temperature=0)
    out = tuned.generate([3, 7], "sjd2", temperature=0, window=16, steps=2)
    assert torch.equal(out.tokens, base.tokens) and out.stats.nfe < base.stats.nfe / 2


def test_budget_zero_reduces_relaxed_methods_to_exact_rules(pipe):
    kw = dict(cfg_scale=2.0, temperature=1.0, seed=7)
    spec = pipe.generate([1, 2, 3, 4], "speculative", k=3, **kw)
    lantern0 = pipe.generate([1, 2, 3, 4], "lantern", k=3, neighbours=8, delta=0.0, **kw)
    assert torch.equal(lantern0.tokens, spec.tokens) and lantern0.stats.deviation == 0.0
    assert build_image_method("lantern", delta=0.0).lossless
    sjd = pipe.generate([1, 2, 3, 4], "sjd", window=3, **kw)
    gsd0 = pipe.generate([1, 2, 3, 4], "gsd", window=3, p_threshold=0.0, **kw)
    assert torch.equal(gsd0.tokens, sjd.tokens) and gsd0.stats.deviation == 0.0
    coupled = pipe.generate([1, 2, 3, 4], "sjd-coupled", window=3, **kw)
    gsd0 = pipe.generate([1, 2, 3, 4], "gsd", window=3, coupled=True, d_threshold=0.0, **kw)
    assert torch.equal(gsd0.tokens, coupled.tokens) and gsd0.stats.deviation == 0.0
    coupled_ar = pipe.generate([1, 2, 3, 4], "ar", coupled=True, **kw)   # the coupled methods' twin: AR on their noise
    assert torch.equal(coupled_ar.tokens, coupled.tokens) and coupled_ar.stats.nfe == GRID * GRID
    assert not torch.equal(pipe.generate([1, 2, 3, 4], "ar", **kw).tokens, coupled.tokens)
    ar = pipe.generate([1, 2, 3, 4], "ar", temperature=0, cfg_scale=2.0)
    assert torch.equal(pipe.generate([1, 2, 3, 4], "zipar", s=GRID, temperature=0, cfg_scale=2.0).tokens, ar.tokens)
    for coupled in (False, True):                # ZipAR rows verified with GSD's groups: budget 0 is the exact rule
        rows = pipe.generate([1, 2, 3, 4], "zipar", s=2, window=3, coupled=coupled, **kw)
        grouped0 = pipe.generate([1, 2, 3, 4], "zipar", s=2, window=3, coupled=coupled, grouped=True, p_threshold=0.0, **kw)
        assert torch.equal(grouped0.tokens, rows.tokens) and grouped0.stats.deviation == 0.0


def test_zipar_grouped_rows_spend_a_budget(pipe):
    out = pipe.generate([1, 2, 3, 4], "zipar", s=2, window=3, coupled=True, grouped=True, p_threshold=0.5,
                        d_threshold=1e6, cfg_scale=2.0, temperature=1.0, seed=3)
    assert out.stats.deviation > 0 and all(len(set(t.flatten().tolist())) > 1 for t in out.tokens)
    with pytest.raises(InputError, match="window >= 1"):
        pipe.generate([1], "zipar", s=2, grouped=True)


def test_relaxed_methods_report_the_budget_they_spend(pipe):
    kw = dict(cfg_scale=2.0, temperature=1.0, seed=3)
    out = pipe.generate([1, 2, 3, 4], "lantern", k=3, neighbours=8, delta=0.3, **kw)
    accepted_drafts = out.stats.new_tokens - out.stats.nfe        # every pass emits one token of its own
    assert 0 < out.stats.deviation <= 0.3 * accepted_drafts + 1e-6
    assert len(out.stats.deviation_per_row) == 4 and abs(sum(out.stats.deviation_per_row) - out.stats.deviation) < 1e-6


def test_loading_from_a_directory(pipe, tmp_path):
    save_gpt(pipe.model, tmp_path / "gpt.safetensors")
    save_vq(pipe.vq, tmp_path / "vq.safetensors")
    loaded = ImagePipeline.from_pretrained(tmp_path)
    assert loaded.draft is None
    a = loaded.generate([3], temperature=0).tokens
    assert torch.equal(a, pipe.generate([3], temperature=0).tokens)
    with pytest.raises(ModelNotFoundError, match="not found"):
        ImagePipeline.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="must hold"):
        ImagePipeline.from_pretrained(tmp_path / "empty")
    with pytest.raises(InputError, match="vq="):
        ImagePipeline.from_pretrained(tmp_path / "gpt.safetensors")
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(InputError):
        ImagePipeline.from_pretrained(tmp_path / "bad.pt", vq=tmp_path / "vq.safetensors")
    with pytest.raises(ModelNotFoundError, match="built-in"):
        ImagePipeline.from_pretrained("builtin:imagenet")


@pytest.mark.parametrize("labels, kw, match", [
    ([], {}, "empty"),
    ([C], {}, "out of range"),
    ([-1], {}, "out of range"),
    (["nope"], {}, "unknown class label"),
    ([1.5], {}, "unknown class label"),
    ([1], {"cfg_scale": -1.0}, "cfg_scale"),
    ([1], {"method": "nope"}, "unknown method"),
    ([1], {"method": "sjd", "window": 0}, "window"),
    ([1], {"method": "lantern", "delta": 1.5}, "delta"),
    ([1], {"method": "gsd", "p_threshold": -0.1}, "p_threshold"),
    ([1], {"method": "zipar", "s": 0}, "s must"),
    ([1], {"method": "zipar", "s": GRID + 1}, "window s"),
    ([1], {"method": "zipar", "s": 2, "stand_in": "left"}, "stand_in"),
    ([1], {"method": "ar", "k": 3}, "does not take"),
])
def test_bad_input(pipe, labels, kw, match):
    with pytest.raises(InputError, match=match):
        pipe.generate(labels, **kw)


def test_class_names_are_accepted(pipe):
    assert pipe.labels(["c3", 4]) == [3, 4]
