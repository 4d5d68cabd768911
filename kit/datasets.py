"""One loader for the 28x28 digit-like data sets every notebook uses, offline-first, and loud about which.

    ds = kit.datasets.load("auto")     # MNIST if cached (or downloadable), else Fashion-MNIST, else sklearn digits
    ds.x_train.shape, ds.name          # (60000, 28, 28) uint8, "mnist"

Where the files are looked for, in order: $KIT_DATA_DIR, then Keras' cache (~/.keras/datasets/mnist.npz), then
Debian's data sets (/usr/share/datasets/; `apt install dataset-fashion-mnist`). Inside a folder: mnist.npz,
mnist/ or fashion-mnist/ (or fashion_mnist/) with the four IDX .gz files.
"""
from __future__ import annotations

import gzip
import os
import socket
import struct
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NAMES = ("auto", "mnist", "fashion_mnist", "digits")
MNIST_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
IDX_FILES = {"x_train": "train-images-idx3-ubyte.gz", "y_train": "train-labels-idx1-ubyte.gz",
             "x_test": "t10k-images-idx3-ubyte.gz", "y_test": "t10k-labels-idx1-ubyte.gz"}
HOW_TO_GET_MNIST = (f"get MNIST with `curl -o ~/.keras/datasets/mnist.npz {MNIST_URL}` on a machine with internet "
                    "(or set KIT_DATA_DIR to a folder holding mnist.npz)")


class DatasetError(RuntimeError):
    """A data set file is missing or unreadable; the message names the path and how to fix it."""


@dataclass
class Dataset:
    """Images as uint8 (N, 28, 28), labels as int64 (N,), plus where they came from."""
    name: str
    source: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def __repr__(self):
        return (f"<Dataset {self.name}: {len(self.x_train)} train / {len(self.x_test)} test images "
                f"{self.x_train.shape[1:]} from {self.source}>")


def data_dirs() -> list[Path]:
    """Return the folders searched, in order."""
    dirs = [Path(os.environ["KIT_DATA_DIR"])] if os.environ.get("KIT_DATA_DIR") else []
    return dirs + [Path.home() / ".keras" / "datasets", Path("/usr/share/datasets")]


def read_mnist_npz(path: Path) -> Dataset:
    """Read a file in Keras' mnist.npz format (keys x_train, y_train, x_test, y_test)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in IDX_FILES}
    except Exception as e:
        raise DatasetError(f"{path} is not a readable mnist.npz ({type(e).__name__}: {e}); delete it and "
                           f"{HOW_TO_GET_MNIST}") from None
    return _checked("mnist", str(path), arrays)


def read_idx_gz(path: Path) -> np.ndarray:
    """Read one gzipped IDX file (the format of the original MNIST and Fashion-MNIST distributions)."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
        zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
        if zero != 0 or dtype_code != 0x08:
            raise ValueError(f"not an unsigned-byte IDX file (magic {data[:4].hex()})")
        shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
        return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)
    except Exception as e:
        raise DatasetError(f"{path} is not a readable IDX file ({type(e).__name__}: {e}); reinstall it "
                           "(Debian: apt install --reinstall dataset-fashion-mnist)") from None


def read_idx_dir(folder: Path, name: str) -> Dataset:
    """Read the four IDX .gz files of an MNIST-format data set in `folder`."""
    return _checked(name, str(folder), {k: read_idx_gz(folder / f) for k, f in IDX_FILES.items()})


def load_digits_28() -> Dataset:
    """scikit-learn's 1,797 real handwritten 8x8 digits, upscaled to 28x28 (3x nearest, padded), split 1497/300."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = np.kron(d.images, np.ones((3, 3)))                       # 8x8 -> 24x24
    x = np.pad(x, ((0, 0), (2, 2), (2, 2)))                      # -> 28x28, a border as in MNIST
    x = np.round(x * (255 / 16)).astype(np.uint8)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(x))
    test, train = idx[:300], idx[300:]
    return Dataset("digits", "sklearn.datasets.load_digits (upscaled 8x8 -> 28x28)", x[train],
                   d.target[train].astype(np.int64), x[test], d.target[test].astype(np.int64))


def download_mnist(dest: Path, timeout: float = 10.0) -> Path:
    """Download mnist.npz to `dest` atomically; raise OSError quickly when offline."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(MNIST_URL, timeout=timeout) as r:
        fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".part")
        with os.fdopen(fd, "wb") as f:
            f.write(r.read())
    os.replace(tmp, dest)
    return dest


def load(name: str = "auto", *, download: bool = True, verbose: bool = True) -> Dataset:
    """Load `name` (auto, mnist, fashion_mnist, digits); 'auto' takes the first available in that order."""
    if name not in NAMES:
        raise ValueError(f"unknown data set {name!r}: choose one of {', '.join(NAMES)}")
    given = os.environ.get("KIT_DATA_DIR")
    if given and name != "digits" and not Path(given).is_dir():   # a typo must not quietly become "digits"
        raise DatasetError(f"KIT_DATA_DIR={given} is not a folder: create it and put mnist.npz (or mnist/, "
                           "fashion-mnist/ with the IDX .gz files) there, or unset KIT_DATA_DIR")
    ds = None
    if name in ("auto", "mnist"):
        ds = _find_mnist(download)
        if ds is None and name == "mnist":
            raise DatasetError(f"MNIST not found (looked for mnist.npz in {', '.join(map(str, data_dirs()))}); "
                               + HOW_TO_GET_MNIST)
    if ds is None and name in ("auto", "fashion_mnist"):
        ds = _find_idx("fashion_mnist")
        if ds is None and name == "fashion_mnist":
            raise DatasetError("Fashion-MNIST not found (looked for its four IDX .gz files in "
                               f"{', '.join(map(str, data_dirs()))}); on Debian/Ubuntu: apt install "
                               "dataset-fashion-mnist, or put the files in $KIT_DATA_DIR")
    if ds is None:
        ds = load_digits_28()
    if verbose:
        loud = "" if ds.name == "mnist" else "  <-- NOT MNIST: MNIST is not available offline here"
        print(f"data set: {ds.name} ({len(ds.x_train)} train / {len(ds.x_test)} test) from {ds.source}{loud}")
    return ds


def _find_mnist(download: bool) -> Dataset | None:
    for d in data_dirs():
        if (d / "mnist.npz").is_file():
            return read_mnist_npz(d / "mnist.npz")
        if all((d / "mnist" / f).is_file() for f in IDX_FILES.values()):
            return read_idx_dir(d / "mnist", "mnist")
    if download:
        try:
            return read_mnist_npz(download_mnist(Path.home() / ".keras" / "datasets" / "mnist.npz"))
        except (OSError, socket.timeout):
            return None
    return None


def _find_idx(name: str) -> Dataset | None:
    for d in data_dirs():
        for folder in (d / name, d / name.replace("_", "-")):
            if all((folder / f).is_file() for f in IDX_FILES.values()):
                return read_idx_dir(folder, name)
    return None


def _checked(name: str, source: str, a: dict) -> Dataset:
    for split in ("train", "test"):
        x, y = a[f"x_{split}"], a[f"y_{split}"]
        if x.ndim != 3 or x.shape[1:] != (28, 28) or len(x) != len(y):
            raise DatasetError(f"{source}: {split} images have shape {x.shape} and labels {y.shape}; expected "
                               "(N, 28, 28) and (N,)")
    return Dataset(name, source, a["x_train"].astype(np.uint8), a["y_train"].astype(np.int64),
                   a["x_test"].astype(np.uint8), a["y_test"].astype(np.int64))
