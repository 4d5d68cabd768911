"""kit.datasets: MNIST read offline from Keras' mnist.npz or IDX files; clear errors for missing/corrupt files."""
import gzip
import struct
import urllib.request

import numpy as np
import pytest

from kit import datasets


def tiny_arrays(n_train=20, n_test=10, seed=0):
    """Return small random MNIST-shaped arrays."""
    rng = np.random.default_rng(seed)
    return {"x_train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
            "y_train": rng.integers(0, 10, n_train).astype(np.uint8),
            "x_test": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
            "y_test": rng.integers(0, 10, n_test).astype(np.uint8)}


def write_idx_gz(path, a: np.ndarray):
    """Write one array as a gzipped IDX file (unsigned bytes), as the MNIST distribution does."""
    header = struct.pack(">HBB", 0, 0x08, a.ndim) + struct.pack(f">{a.ndim}I", *a.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + a.astype(np.uint8).tobytes())


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """An empty data folder in KIT_DATA_DIR, an empty HOME, and any network access failing the test."""
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("KIT_DATA_DIR", str(data))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    def no_network(*a, **k):
        raise AssertionError("kit.datasets tried to use the network")
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    return data


def test_reads_keras_mnist_npz_without_network(offline, capsys):
    a = tiny_arrays()
    np.savez(offline / "mnist.npz", **a)
    ds = datasets.load("mnist", download=False)
    assert ds.name == "mnist" and ds.source == str(offline / "mnist.npz")
    for k in datasets.IDX_FILES:
        np.testing.assert_array_equal(getattr(ds, k), a[k])
    assert datasets.load("auto").name == "mnist"   # auto prefers MNIST (and must not download: urlopen fails)
    assert "data set: mnist" in capsys.readouterr().out


def test_reads_idx_files_without_network(offline):
    a = tiny_arrays(seed=1)
    for name, folder in (("mnist", offline / "mnist"), ("fashion_mnist", offline / "fashion-mnist")):
        folder.mkdir()
        for k, f in datasets.IDX_FILES.items():
            write_idx_gz(folder / f, a[k])
        ds = datasets.load(name, download=False, verbose=False)
        assert ds.name == name and ds.source == str(folder)
        np.testing.assert_array_equal(ds.x_train, a["x_train"])
        np.testing.assert_array_equal(ds.y_test, a["y_test"].astype(np.int64))


def test_missing_mnist_names_paths_and_how_to_get_it(offline):
    with pytest.raises(datasets.DatasetError) as e:
        datasets.load("mnist", download=False)
    msg = str(e.value)
    assert str(offline) in msg and "mnist.npz" in msg and datasets.MNIST_URL in msg


def test_corrupt_npz_names_the_file_and_how_to_get_mnist(offline):
    (offline / "mnist.npz").write_bytes(b"this is not a zip file")
    with pytest.raises(datasets.DatasetError) as e:
        datasets.load("auto", download=False)
    assert str(offline / "mnist.npz") in str(e.value) and datasets.MNIST_URL in str(e.value)


def test_corrupt_idx_names_the_file(offline):
    folder = offline / "mnist"
    folder.mkdir()
    for f in datasets.IDX_FILES.values():
        (folder / f).write_bytes(b"\x1f\x8b broken gzip")
    with pytest.raises(datasets.DatasetError) as e:
        datasets.load("mnist", download=False)
    assert str(folder / datasets.IDX_FILES["x_train"]) in str(e.value)


def test_digits_always_available_and_said_to_stand_in(offline, capsys):
    ds = datasets.load("digits")
    assert ds.x_train.shape == (1497, 28, 28) and ds.x_test.shape == (300, 28, 28)
    assert ds.x_train.dtype == np.uint8 and set(np.unique(ds.y_train)) == set(range(10))
    out = capsys.readouterr().out
    assert "digits" in out and "a stand-in for MNIST" in out and str(ds.source) not in out


def test_unknown_name_is_refused():
    with pytest.raises(ValueError, match="is not allowed: one of auto, mnist, fashion_mnist, digits"):
        datasets.load("cifar10")
