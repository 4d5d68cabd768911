"""Horovod + Keras MNIST (notebook 04 and kit.mnist.train): the model, its data and its training constants.

    model = kit.mnist.build_model()                     # the classic Keras MNIST CNN
    x, y = kit.mnist.shard(x, y, hvd.rank(), hvd.size()) # Horovod: each rank trains on its 1/size of the data

The six Horovod steps themselves stay in the notebook and in the script, where they can be read.
"""
from __future__ import annotations

import numpy as np

from kit.mnist.tfimport import keras

BATCH = 128             # the classic example's batch size (per worker)
EPOCHS = 12             # the classic example trains 12 epochs; sharded, N workers keep the 12 (see shard)
BASE_LR = 0.001         # Adam's rate in Horovod's TF2 Keras MNIST example (the article's older one: Adadelta, 1.0)
WARMUP_EPOCHS = 3       # gradual warmup from lr to lr * size (Goyal et al.; Horovod's Keras example uses 3)
DECAY = 0.1             # step decay: the last quarter of the epochs at 0.1 x the rate (see decay_start)
SCHEDULE = f"Adam at {BASE_LR} x N, warmup {WARMUP_EPOCHS} epochs, x{DECAY} for the last quarter"  # results/mnist.json
SUBSET = (6_000, 2_000)  # train / test images of notebook 04's default run, and of `kit.bench mnist`'s accuracy runs
SEEDS = (0, 1, 2, 3, 4)  # `kit.bench mnist`: accuracy runs per arm (2 workers, 1 process, the control): the spread


def build_model():
    """Return the classic Keras MNIST CNN (uncompiled)."""
    L = keras().layers
    return keras().Sequential([
        keras().Input((28, 28, 1)),
        L.Conv2D(32, 3, activation="relu"), L.Conv2D(64, 3, activation="relu"), L.MaxPooling2D(2),
        L.Dropout(0.25), L.Flatten(), L.Dense(128, activation="relu"), L.Dropout(0.5),
        L.Dense(10, activation="softmax")])


def prepare(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scale uint8 (N, 28, 28) images to float32 (N, 28, 28, 1) in [0, 1]; labels to int64."""
    return (x.astype(np.float32) / 255.0)[..., None], y.astype(np.int64)


def subset(x: np.ndarray, y: np.ndarray, n: int | None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return n examples drawn without replacement (all of them if n is None or too big)."""
    if n is None or n >= len(x):
        return x, y
    idx = np.random.default_rng(seed).permutation(len(x))[:n]
    return x[idx], y[idx]


def shard(x: np.ndarray, y: np.ndarray, rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return rank's 1/size of the data (every size-th example from `rank`), equal-length on every rank.

    The kit's convention (Horovod's tensorflow2_keras_mnist.py: steps_per_epoch // size): an epoch is one pass
    over the data shared by the ranks, so N workers run the same epochs as one process, each epoch in 1/N of
    the steps (of an N-times larger global batch). The other convention (Horovod's keras_mnist.py: every rank
    sees all data, ceil(12 / N) epochs) gives the same samples in total; doing both would train 1/N of them.
    """
    n = len(x) // size * size        # equal lengths: ranks must run the same number of steps (allreduce!)
    return x[rank:n:size], y[rank:n:size]


def steps_per_epoch(n_samples: int, size: int, batch: int = BATCH) -> int:
    """Return each rank's optimizer steps per epoch when n_samples are sharded over size ranks (batch per rank),
    as Keras' fit counts them: the last, partial batch of the shard is a step too (ceil)."""
    return -(-(n_samples // size) // batch)


def decay_start(epochs: int) -> int:
    """Return the first epoch (0-based) trained at DECAY x the learning rate: the last quarter of `epochs`.

    Goyal et al.'s recipe ends with the rate divided by 10, as ResNet's schedule does; without it this short run
    ends at the full (for N workers, N-times) rate, and its test accuracy still jumps from epoch to epoch."""
    return epochs - epochs // 4


def weights_digest(model) -> str:
    """Return a short hash of every weight of `model` (equal on all ranks iff the replicas are identical)."""
    import hashlib
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()[:16]
