import gzip

import numpy as np
import pytest
import torch

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.image.data import CLASS_NAMES, FASHION_MNIST_ROOT, load_fashion_mnist, to_model_images


def write_fake_fashion_mnist(root, n_train: int = 12, n_test: int = 6, seed: int = 0):
    """Four gzip'd IDX files in the Fashion-MNIST layout with random pixels and labels."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        header = (2051).to_bytes(4, "big") + n.to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
        pixels = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        (root / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + pixels.tobytes()))
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        header = (2049).to_bytes(4, "big") + n.to_bytes(4, "big")
        (root / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(header + labels.tobytes()))
    return root


def test_class_names():
    assert len(CLASS_NAMES) == 10 and CLASS_NAMES[0] == "T-shirt/top" and CLASS_NAMES[9] == "Ankle boot"


def test_load_fake_files(tmp_path):
    root = write_fake_fashion_mnist(tmp_path / "fm")
    for split, n in (("train", 12), ("test", 6)):
        images, labels = load_fashion_mnist(split, root=root)
        assert images.shape == (n, 28, 28) and images.dtype == torch.uint8
        assert labels.shape == (n,) and labels.dtype == torch.int64
        assert 0 <= int(labels.min()) and int(labels.max()) <= 9


@pytest.mark.skipif(not FASHION_MNIST_ROOT.is_dir(), reason="Debian dataset-fashion-mnist not installed")
def test_load_real_test_split():
    images, labels = load_fashion_mnist("test")
    assert images.shape == (10000, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (10000,) and labels.dtype == torch.int64
    assert torch.equal(torch.bincount(labels), torch.full((10,), 1000))  # balanced classes
    assert labels[:3].tolist() == [9, 2, 1]  # ankle boot, pullover, trouser: the published first test labels


def test_missing_files_name_the_apt_command(tmp_path):
    with pytest.raises(ModelNotFoundError, match="apt-get install -y dataset-fashion-mnist") as err:
        load_fashion_mnist("train", root=tmp_path)
    assert "train-images-idx3-ubyte.gz" in str(err.value)


def test_bad_split():
    with pytest.raises(InputError, match="split"):
        load_fashion_mnist("val")


def test_to_model_images_shape_and_range():
    images = torch.tensor([[[0, 255], [128, 64]]], dtype=torch.uint8).repeat(3, 14, 14)  # [3, 28, 28]
    x = to_model_images(images, size=64)
    assert x.shape == (3, 3, 64, 64) and x.dtype == torch.float32
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0
    assert torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 0], x[:, 2])  # grey replicated
    black, white = torch.zeros(1, 28, 28, dtype=torch.uint8), torch.full((1, 28, 28), 255, dtype=torch.uint8)
    assert torch.allclose(to_model_images(black, 16), torch.tensor(-1.0))
    assert torch.allclose(to_model_images(white, 16), torch.tensor(1.0))
    assert to_model_images(black, 28).shape == (1, 3, 28, 28)


def test_to_model_images_rejects_float():
    with pytest.raises(InputError, match="uint8"):
        to_model_images(torch.zeros(2, 28, 28))
