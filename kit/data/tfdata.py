"""The pipeline of ``kit.data`` for Keras 3 (``keras.utils.PyDataset``) and for tf.data (notebook 01, section 5).

    kds = kit.data.tfdata.keras_dataset(store, 64, io_ms=0.6, workers=4)        # Keras 3's loader knobs
    ds = kit.data.tfdata.tf_dataset(store, 64, io_ms=0.6, parallel="autotune")  # map -> batch -> prefetch
    kit.data.tfdata.run_ahead(ds, away_s=0.04)    # per batch: the loader alone, and after a 40 ms step
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from kit.data import monitor
from kit.data.pipeline import ImageStore, checked_sample


@lru_cache(maxsize=None)
def _keras_class():
    import keras

    class KerasImages(keras.utils.PyDataset):
        """The pipeline as a Keras 3 PyDataset: batch b = samples [b*B, (b+1)*B) in a per-epoch shuffled order."""

        def __init__(self, store, batch_size, io_ms=0.0, seed=0, **kwargs):
            super().__init__(**kwargs)                # workers=, use_multiprocessing=, max_queue_size=
            self.store, self.batch_size, self.io_ms, self.seed = store, batch_size, io_ms, seed
            self.order = np.random.default_rng(seed).permutation(len(store))

        def __len__(self):
            return len(self.store) // self.batch_size

        def __getitem__(self, b):
            idx = self.order[b * self.batch_size:(b + 1) * self.batch_size]
            xs, ys = zip(*(checked_sample(self.store, int(i), self.io_ms, self.seed) for i in idx))
            return np.stack(xs), np.array(ys, np.int64)
    return KerasImages


def keras_dataset(store: ImageStore, batch_size: int = 64, io_ms: float = 0.0, workers: int = 1,
                  use_multiprocessing: bool = False, max_queue_size: int = 10, seed: int = 0):
    """Return the pipeline as keras.utils.PyDataset(workers=, use_multiprocessing=, max_queue_size=)."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"Keras workers must be an integer >= 1 (1 without multiprocessing loads in the "
                         f"training loop), got {workers!r}")
    return _keras_class()(store, batch_size, io_ms, seed, workers=workers,
                          use_multiprocessing=use_multiprocessing, max_queue_size=max_queue_size)


def keras_model():
    """Return the same CNN as make_model() in Keras 3, compiled with SGD."""
    import keras
    from keras import layers
    model = keras.Sequential([keras.Input((1, 28, 28)), layers.Permute((2, 3, 1)),
                              layers.Conv2D(32, 3, padding="same", activation="relu"), layers.MaxPooling2D(),
                              layers.Conv2D(64, 3, padding="same", activation="relu"), layers.MaxPooling2D(),
                              layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def measure_keras(model, dataset, steps: int = 40, warmup: int = 3) -> monitor.Monitor:
    """Fit `model` for `steps` steps on a PyDataset inside a Monitor (wait = the gap between batches)."""
    with monitor.Monitor(warmup=warmup, nvml=False) as mon:
        model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[mon.keras_callback()])
    for s in mon.steps:
        s.samples = dataset.batch_size
    return mon


# --- tf.data -------------------------------------------------------------------------------------------------
def tf_dataset(store: ImageStore, batch_size: int = 64, io_ms: float = 0.0, parallel=None,
               prefetch: bool | int = True, seed: int = 0):
    """Return the pipeline as tf.data: map(load, num_parallel_calls=parallel) -> batch -> prefetch(AUTOTUNE), or
    prefetch(n) for an integer n >= 1, or no prefetch (False)."""
    if prefetch is not True and prefetch is not False and not (isinstance(prefetch, int) and prefetch >= 1):
        raise ValueError(f"prefetch must be True (AUTOTUNE), False or a buffer of n >= 1 batches, got {prefetch!r}")
    import tensorflow as tf
    calls = tf.data.AUTOTUNE if parallel == "autotune" else parallel

    def load(i):
        return checked_sample(store, int(i), io_ms, seed)

    def tf_load(i):
        x, y = tf.numpy_function(load, [i], (tf.float32, tf.int64), stateful=False)
        return tf.ensure_shape(x, (1, 28, 28)), tf.ensure_shape(y, ())

    ds = tf.data.Dataset.range(len(store)).shuffle(len(store), seed=seed)
    ds = ds.map(tf_load, num_parallel_calls=calls, **({"deterministic": True} if calls else {}))
    ds = ds.batch(batch_size, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False   # keep `parallel=None` really sequential
    options.experimental_optimization.inject_prefetch = False       # and add no prefetch we did not ask for
    ds = ds.with_options(options)
    if prefetch is False:
        return ds
    return ds.prefetch(tf.data.AUTOTUNE if prefetch is True else prefetch)


def tf_batches(ds):
    """Yield a tf.data dataset's batches as torch tensors (the same training step consumes every loader)."""
    for x, y in ds.as_numpy_iterator():
        yield torch.from_numpy(np.array(x)), torch.from_numpy(np.array(y))


def run_ahead(ds, away_s: float, steps: int = 12) -> dict:
    """Time `next()` on the tf.data pipeline `ds` (its batches as tf_batches yields them): taken as soon as the last
    one arrived (the loader's own time per batch: nothing to overlap with), and after the consumer was away `away_s`
    seconds, as during a step that leaves the cores free (what it loaded meanwhile). Return {"load_ms",
    "after_away_ms", "away_ms"}, medians over `steps` batches after 2 of warm-up."""
    import time
    out = {"away_ms": 1e3 * away_s}
    for key, away in (("load_ms", 0.0), ("after_away_ms", away_s)):
        it, waits = iter(tf_batches(ds)), []
        next(it), next(it)
        for _ in range(steps):
            time.sleep(away)
            t = time.perf_counter()
            next(it)
            waits.append(time.perf_counter() - t)
        out[key] = 1e3 * float(np.median(waits))
    return out
