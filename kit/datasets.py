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
    """Images as uint8 (N, 28, 28), labels as int64 (N,) class numbers 0..9, plus where they came from.

    The constructor checks and converts what it is given (check_images, check_labels): pixels must be whole numbers
    in 0..255 (any integer or float dtype), labels whole numbers 0..9 of shape (N,); a DatasetError says what is
    wrong otherwise (float images in 0..1 would all become 0, values above 255 would wrap around)."""
    name: str
    source: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def __post_init__(self):
        for split in ("train", "test"):
            x = check_images(self.source, f"x_{split}", getattr(self, f"x_{split}"))
            y = check_labels(self.source, f"y_{split}", getattr(self, f"y_{split}"))
            if len(x) != len(y):
                raise DatasetError(f"{self.source}: {split}: {len(x)} images but {len(y)} labels; expected one "
                                   "label per image")
            setattr(self, f"x_{split}", x)
            setattr(self, f"y_{split}", y)

    def __repr__(self):
        return (f"<Dataset {self.name}: {len(self.x_train)} train / {len(self.x_test)} test images "
                f"{self.x_train.shape[1:]} from {self.source}>")


CLASSES = 10
SHAPE = (28, 28)


def check_images(source: str, key: str, x) -> np.ndarray:
    """Return images `x` as uint8 (N, 28, 28), or raise DatasetError naming `source`, `key` and what is wrong."""
    x = np.asarray(x)
    where = f"{source}: {key}"
    if x.dtype.kind not in "uif":
        raise DatasetError(f"{where}: dtype {x.dtype} is not allowed: uint8 pixels (or any integer or float dtype "
                           "holding whole numbers 0..255)")
    if x.ndim != 3 or x.shape[1:] != SHAPE:
        raise DatasetError(f"{where}: shape {x.shape} is not allowed: (N, 28, 28) images")
    if not len(x):
        raise DatasetError(f"{where}: no images (N = 0): a data set needs at least one image per split")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise DatasetError(f"{where}: NaN or infinite pixels are not allowed: whole numbers 0..255")
    lo, hi = x.min(), x.max()
    whole = x.dtype.kind != "f" or bool((x == np.round(x)).all())
    if x.dtype.kind == "f" and 0 <= lo and hi <= 1 and not whole:
        raise DatasetError(f"{where}: float images with values in 0..1 (max {hi:.3g}) would all become 0 as uint8: "
                           "multiply by 255 first (np.round(x * 255)); pixels are whole numbers 0..255")
    if lo < 0 or hi > 255:
        raise DatasetError(f"{where}: values {lo:g}..{hi:g} do not fit 0..255 (uint8 pixels would wrap around): "
                           "rescale them to 0..255")
    if not whole:
        raise DatasetError(f"{where}: float images with fractions (e.g. {x.flat[np.argmax(x != np.round(x))]:g}) "
                           "are not allowed: round them to whole numbers 0..255")
    return x.astype(np.uint8)


def check_labels(source: str, key: str, y) -> np.ndarray:
    """Return labels `y` as int64 (N,) class numbers 0..9, or raise DatasetError naming what is wrong."""
    y = np.asarray(y)
    where = f"{source}: {key}"
    if y.ndim == 2 and y.shape[1] == CLASSES and y.size and np.isin(y, (0, 1)).all():
        raise DatasetError(f"{where}: shape {y.shape} looks one-hot: labels are class numbers 0..9 of shape (N,): "
                           "pass y.argmax(1)")
    if y.ndim != 1:
        raise DatasetError(f"{where}: shape {y.shape} is not allowed: (N,) class numbers 0..9 (for (N, 1) pass "
                           "y.ravel())")
    if y.dtype.kind not in "uif" or (y.dtype.kind == "f" and not (np.isfinite(y).all() and (y == np.round(y)).all())):
        raise DatasetError(f"{where}: dtype {y.dtype}{' with fractions' if y.dtype.kind == 'f' else ''} is not "
                           "allowed: whole class numbers 0..9")
    if len(y) and (y.min() < 0 or y.max() >= CLASSES):
        raise DatasetError(f"{where}: labels {y.min():g}..{y.max():g} are not allowed: class numbers "
                           f"0..{CLASSES - 1}")
    return y.astype(np.int64)


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
    return checked("mnist", str(path), arrays)


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
    return checked(name, str(folder), {k: read_idx_gz(folder / f) for k, f in IDX_FILES.items()})


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
    if not isinstance(name, str) or name not in NAMES:
        raise ValueError(f"kit.datasets.load: name={name!r} is not allowed: one of {', '.join(NAMES)}")
    for arg, flag in (("download", download), ("verbose", verbose)):
        if not isinstance(flag, bool):
            raise ValueError(f"kit.datasets.load: {arg}={flag!r} is not allowed: True or False")
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
        stand_in = "" if ds.name == "mnist" else ", a stand-in for MNIST (MNIST is not available offline here)"
        print(f"data set: {ds.name} ({len(ds.x_train)} train / {len(ds.x_test)} test){stand_in}")
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


def checked(name: str, source: str, a: dict) -> Dataset:
    """Return the Dataset of arrays `a` (x_train, y_train, x_test, y_test) read from `source`, checked (Dataset)."""
    return Dataset(name, source, a["x_train"], a["y_train"], a["x_test"], a["y_test"])
