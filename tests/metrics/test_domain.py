"""Domain FID on the shipped Fashion-MNIST classifier: accuracy, separation of real from fake, torchmetrics
agreement, cached reference statistics, and the training script (resume + export) on fake data."""

import json

import pytest
import torch

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.image.data import load_fashion_mnist, to_model_images
from mmaccel.image.train import train_classifier
from mmaccel.metrics import fid
from mmaccel.metrics.domain import (
    IMAGE_SIZE,
    classify,
    default_weights_path,
    domain_features,
    domain_fid,
    load_classifier,
    to_classifier_input,
)
from tests.image.test_data import write_fake_fashion_mnist


@pytest.fixture(scope="module")
def fashion():
    train, _ = load_fashion_mnist("train")
    test, test_labels = load_fashion_mnist("test")
    return train, test, test_labels


def noise_images(n, seed=0):
    return torch.rand(n, 3, 64, 64, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_shipped_classifier_is_small_and_loads():
    path = default_weights_path()
    assert path.is_file() and path.stat().st_size < 2_000_000
    model = load_classifier(path)
    assert not model.training and model.config.feature_dim == 128


def test_accuracy_on_1000_test_images(fashion):
    _, test, labels = fashion
    images, labels = test[:1000], labels[:1000]
    assert (classify(images) == labels).float().mean() >= 0.85  # 28x28 uint8, as stored
    assert (classify(to_model_images(images, 64)) == labels).float().mean() >= 0.85  # the image models' 64x64 floats


def test_domain_fid_separates_real_from_noise(fashion):
    train, test, _ = fashion
    real_a = domain_features(to_model_images(train[:1000], 64))
    real_b = domain_features(to_model_images(test[:1000], 64))
    noise = domain_features(noise_images(1000))
    assert real_a.shape == (1000, 128) and real_a.dtype == torch.float32
    real_vs_real = fid.fid_from_features(real_a, real_b)
    assert 0 < real_vs_real < 0.05 * fid.fid_from_features(noise, real_b)
    assert abs(fid.fid_from_features(real_a, real_a)) < 1e-6 * real_vs_real
    assert fid.fid_from_features(real_b, real_a) == pytest.approx(real_vs_real, rel=1e-6)


def test_domain_fid_matches_torchmetrics(fashion):
    """The domain extractor as a custom `feature` module of torchmetrics' FrechetInceptionDistance."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    class Domain(torch.nn.Module):
        num_features = 128

        def forward(self, x):
            return domain_features(x)

    train, test, _ = fashion
    real, fake = train[:300], to_model_images(test[:200], 64)
    metric = FrechetInceptionDistance(feature=Domain())
    metric.update(fid.to_uint8_rgb(real), real=True)
    metric.update(fid.to_uint8_rgb(fake), real=False)
    assert domain_fid(fake, real) == pytest.approx(float(metric.compute()), rel=1e-4)


def test_reference_stats_cached(tmp_path, fashion, monkeypatch):
    _, test, _ = fashion
    mu, sigma = fid.reference_stats("test", limit=200, extractor="domain", cache_dir=tmp_path)
    (cached,) = (tmp_path / fid.STATS_DIR).iterdir()
    assert cached.name.startswith("domain-clf") and "-test-200-64px" in cached.name
    assert mu.shape == (128,) and sigma.shape == (128, 128) and mu.dtype == torch.float64
    generated = noise_images(50)
    assert fid.fid(generated, (mu, sigma), extractor="domain") == pytest.approx(
        domain_fid(generated, to_model_images(test[:200], 64)), rel=1e-9)

    def no_data(*args, **kwargs):
        raise AssertionError("reference_stats reloaded the data instead of using its cache")

    monkeypatch.setattr("mmaccel.image.data.load_fashion_mnist", no_data)
    mu2, sigma2 = fid.reference_stats("test", limit=200, extractor="domain", cache_dir=tmp_path)
    assert torch.equal(mu, mu2) and torch.equal(sigma, sigma2)


def test_classifier_inputs():
    assert to_classifier_input(noise_images(2)).shape == (2, 1, IMAGE_SIZE, IMAGE_SIZE)
    x = torch.randint(0, 256, (2, 3, 28, 28), dtype=torch.uint8)
    assert torch.allclose(to_classifier_input(x), x.float().mean(1, keepdim=True) / 127.5 - 1)
    from PIL import Image
    pil = [Image.fromarray(im.numpy()).resize((64, 64)) for im in x[:, 0]]
    assert classify(pil).shape == (2,)
    with pytest.raises(InputError, match="channels-last"):
        classify(torch.zeros(2, 28, 28, 3))


def test_load_classifier_errors(tmp_path):
    with pytest.raises(ModelNotFoundError, match="train_classifier"):
        load_classifier(tmp_path / "missing.safetensors")
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(InputError, match="metadata"):
        load_classifier(tmp_path / "other.safetensors")


def test_train_resume_export(tmp_path):
    root = write_fake_fashion_mnist(tmp_path / "fm", n_train=16, n_test=6)
    out, export = tmp_path / "run", tmp_path / "clf.safetensors"
    common = ["--out", str(out), "--data-root", str(root), "--batch-size", "4", "--threads", "1",
              "--channels", "4", "8", "--feature-dim", "16", "--ckpt-every", "2", "--log-every", "1"]
    assert train_classifier.main([*common, "--steps", "2", "--no-eval"]) == 0
    assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == 2
    assert train_classifier.main([*common, "--steps", "4", "--export", str(export)]) == 0
    log = (out / "train.log").read_text()
    assert "resumed from" in log and "at step 2" in log and "step 4/4" in log and "step 1/4" not in log
    assert "differs" not in log
    model = load_classifier(export)
    assert model.config.channels == (4, 8) and model.config.feature_dim == 16
    assert domain_features(torch.zeros(3, 28, 28, dtype=torch.uint8), weights=export).shape == (3, 16)
    result = json.loads((out / "eval.json").read_text())
    assert result["images"] == 6 and 0 <= result["accuracy_28px"] <= 1 and 0 <= result["accuracy_via_64px"] <= 1
