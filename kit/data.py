"""A realistic input pipeline: encoded images decoded and augmented per sample, optional read latency (notebook 01).

    store = kit.data.make_store(2048, size=28, fmt="png")        # the "disk": PNG/JPEG bytes + labels
    ds = kit.data.ImageDataset(store, io_ms=0.5)                  # per sample: read (sleep) -> decode -> augment
    loader = kit.data.make_loader(ds, batch_size=64, num_workers=2)

Two kinds of cost, and they behave differently on a machine with few cores:
- CPU work (PNG/JPEG decode, crop/flip/affine, normalise) needs a free core; W workers on 2 cores cannot
  decode faster than 2 cores can, and they compete with the training step for those cores.
- I/O latency (`io_ms`, a sleep standing in for a disk or network read) needs no core; W workers overlap W
  reads, so it parallelises past the core count.
The same pipeline is also built for Keras 3 (`keras_dataset`, a `keras.utils.PyDataset`) and tf.data
(`tf_dataset`). `bench(out_dir, quick)` is `python -m kit.bench loading`.
"""
from __future__ import annotations

import io
import re
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

from . import monitor

FORMATS = {"png": "PNG", "jpeg": "JPEG"}


# --- the stored data -------------------------------------------------------------------------------------
@dataclass
class ImageStore:
    """Encoded images (PNG or JPEG bytes) and their labels: what a loader reads from disk."""
    images: list
    labels: np.ndarray
    size: int
    fmt: str

    def __len__(self):
        return len(self.images)

    def __repr__(self):
        kib = sum(map(len, self.images)) / len(self.images) / 1024
        return f"<ImageStore {len(self)} {self.fmt.upper()} images {self.size}x{self.size}, {kib:.1f} KiB each>"


def encode(image: np.ndarray, size: int = 28, fmt: str = "png") -> bytes:
    """Encode one uint8 grayscale image as PNG/JPEG bytes, resized to size x size."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
    im = Image.fromarray(image)
    if im.size != (size, size):
        im = im.resize((size, size), Image.BICUBIC)
    buf = io.BytesIO()
    im.save(buf, format=FORMATS[fmt], **({"quality": 90} if fmt == "jpeg" else {}))
    return buf.getvalue()


def make_store(n: int = 2048, size: int = 28, fmt: str = "png", source: str = "auto",
               verbose: bool = False) -> ImageStore:
    """Encode the first n training images of a kit.datasets data set (repeated if it has fewer)."""
    from . import datasets
    ds = datasets.load(source, verbose=verbose)
    idx = np.arange(n) % len(ds.x_train)
    return ImageStore([encode(ds.x_train[i], size, fmt) for i in idx], ds.y_train[idx], size, fmt)


# --- one sample: read -> decode -> augment -> normalise ----------------------------------------------------
def read(store: ImageStore, i: int, io_ms: float = 0.0) -> bytes:
    """Return the encoded bytes of sample i after io_ms of simulated storage latency (no CPU used)."""
    if io_ms > 0:
        time.sleep(io_ms / 1000)
    return store.images[i]


def decode(data: bytes) -> Image.Image:
    """Decode PNG/JPEG bytes into a grayscale PIL image."""
    im = Image.open(io.BytesIO(data))
    im.load()
    return im.convert("L") if im.mode != "L" else im


def augment(im: Image.Image, rng: np.random.Generator, out: int = 28) -> np.ndarray:
    """Random crop (80-100%), horizontal flip, rotation+shift, resize to out x out; return float32 (1, out, out)."""
    s = im.size[0]
    c = int(s * rng.uniform(0.8, 1.0))
    x0, y0 = rng.integers(0, s - c + 1, size=2)
    im = im.crop((int(x0), int(y0), int(x0) + c, int(y0) + c))
    if rng.random() < 0.5:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    shift = tuple(int(v) for v in rng.integers(-2, 3, size=2))
    im = im.rotate(float(rng.uniform(-15, 15)), resample=Image.BILINEAR, translate=shift)
    im = im.resize((out, out), Image.BILINEAR)
    return ((np.asarray(im, np.float32) / 255 - 0.5) / 0.5)[None]


def load_sample(store: ImageStore, i: int, io_ms: float = 0.0, seed: int = 0, out: int = 28):
    """Return (image float32 (1, out, out), label) for sample i; its augmentation depends only on (seed, i)."""
    rng = np.random.default_rng((seed, i))
    return augment(decode(read(store, i, io_ms)), rng, out), int(store.labels[i])


# --- PyTorch -----------------------------------------------------------------------------------------------
class SampleError(RuntimeError):
    """Loading one sample failed; the message names the sample index and the original exception."""


class ImageDataset(Dataset):
    """The pipeline as a torch Dataset: sample i is read (io_ms latency), decoded and augmented on access."""

    def __init__(self, store: ImageStore, io_ms: float = 0.0, seed: int = 0, out: int = 28):
        self.store, self.io_ms, self.seed, self.out = store, io_ms, seed, out

    def __len__(self):
        return len(self.store)

    def __getitem__(self, i):
        x, y = load_sample(self.store, int(i), self.io_ms, self.seed, self.out)
        return torch.from_numpy(x), y


class CheckedDataset(Dataset):
    """Wrap any Dataset so that a failing __getitem__ raises SampleError naming the index and the cause."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        try:
            return self.dataset[i]
        except Exception as e:
            raise SampleError(f"sample {i} failed to load: {type(e).__name__}: {e}") from e


class Loader(DataLoader):
    """A DataLoader that stops its worker processes at once when a batch fails, instead of at garbage collection."""

    def __iter__(self):
        it = super().__iter__()
        try:
            yield from it
        except SampleError as e:
            self.stop_workers(it)
            found = re.findall(r"^(?:\S*SampleError: )?(sample \d+ failed to load: .*)$", str(e), re.M)
            cause = found[-1] if found else str(e).splitlines()[0]   # a worker's error arrives as a traceback
            where = "in a DataLoader worker; workers stopped" if self.num_workers else "in the main process"
            raise SampleError(f"{cause} ({where})" + (f"\n{e}" if self.num_workers else "")) from e
        except Exception:
            self.stop_workers(it)
            raise

    def stop_workers(self, it):
        """Shut the worker processes down now, persistent ones included (they would wait on a failed epoch)."""
        if hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self._iterator = None


def make_loader(dataset, batch_size: int = 64, num_workers: int = 0, prefetch_factor: int | None = None,
                persistent_workers: bool = False, pin_memory: bool = False, shuffle: bool = True,
                seed: int = 0) -> Loader:
    """Return a DataLoader over `dataset` (errors name the failing sample; num_workers checked)."""
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0 (0 loads in the main process), got {num_workers!r}")
    if num_workers == 0 and (prefetch_factor is not None or persistent_workers):
        raise ValueError("prefetch_factor and persistent_workers need num_workers > 0 (they configure workers)")
    extra = {"prefetch_factor": prefetch_factor} if prefetch_factor is not None else {}
    return Loader(CheckedDataset(dataset), batch_size=batch_size, shuffle=shuffle, drop_last=True,
                  num_workers=num_workers, persistent_workers=persistent_workers, pin_memory=pin_memory,
                  generator=torch.Generator().manual_seed(seed), **extra)


def make_model() -> nn.Module:
    """Return the small CNN every run trains (two conv blocks, two dense layers; 28x28x1 in, 10 classes)."""
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def make_step(model: nn.Module, lr: float = 0.01, device: str | None = None):
    """Return step(batch): one SGD step of `model` on (x, y), copying to `device` with non_blocking=True."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def step(batch):
        x, y = batch
        x = torch.as_tensor(x).to(device, non_blocking=True)   # overlaps the copy with compute if pinned
        y = torch.as_tensor(y).to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def sync_fn():
    """Return torch.cuda.synchronize on a GPU (so step times include the kernels), else None."""
    return torch.cuda.synchronize if torch.cuda.is_available() else None


def measure(loader, step, steps: int = 40, warmup: int = 3) -> monitor.Monitor:
    """Train `steps` steps from `loader` inside a Monitor and return it (stats(), plot())."""
    with monitor.Monitor(warmup=warmup, sync=sync_fn()) as mon:     # without NVML: warns once, CPU trace only
        for batch in mon.watch(loader, steps=steps):
            step(batch)
    return mon


# --- Keras 3 -------------------------------------------------------------------------------------------------
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


def checked_sample(store: ImageStore, i: int, io_ms: float = 0.0, seed: int = 0):
    """load_sample, raising SampleError naming the index if it fails."""
    try:
        return load_sample(store, i, io_ms, seed)
    except Exception as e:
        raise SampleError(f"sample {i} failed to load: {type(e).__name__}: {e}") from e


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
               prefetch: bool = True, seed: int = 0):
    """Return the pipeline as tf.data: map(load, num_parallel_calls=parallel) -> batch -> prefetch(AUTOTUNE)."""
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
    return ds.prefetch(tf.data.AUTOTUNE) if prefetch else ds


def tf_batches(ds):
    """Yield a tf.data dataset's batches as torch tensors (the same training step consumes every loader)."""
    for x, y in ds.as_numpy_iterator():
        yield torch.from_numpy(np.array(x)), torch.from_numpy(np.array(y))


# --- the model of step time, fitted to a W=0 run ----------------------------------------------------------
def fit_model(mon0: monitor.Monitor, mon_many: monitor.Monitor | None = None, cores: int | None = None) -> dict:
    """Fit the model's numbers from a num_workers=0 run and (optionally) a run with many workers."""
    st = mon0.stats()
    fit = {"t_load": st["wait"], "t_load_cpu": min(st["wait_cpu"], st["wait"]), "t_compute": st["compute"],
           "c_compute": min(st["compute_cpu"], st["compute"]), "cores": cores or monitor.cpu_cores(),
           "t_compute_alone": st["compute"]}
    if mon_many is not None:                           # the step with workers running, and the batch hand-over
        fit.update(t_compute=mon_many.stats()["compute"], t_handover=handover(mon_many))
    return fit


def handover(mon: monitor.Monitor) -> float:
    """Return the wait for a batch that is already queued (10th percentile of waits): the hand-over cost."""
    return float(np.percentile([s.wait for s in mon.steady()], 10))


def predicted(fit: dict, workers: int) -> float:
    """Predict the time per step (s) with `workers` workers from fit_model's numbers."""
    return monitor.predict_step(workers, **fit)


def sweep(dataset, step, workers=(0, 1, 2, 3, 4), steps: int = 40, batch_size: int = 64, rounds: int = 1,
          **loader_kw) -> dict:
    """Measure each num_workers setting, `rounds` times interleaved; return {workers: merged Monitor}."""
    runs = {w: [] for w in workers}
    for _ in range(rounds):                            # interleaved, so a slow minute hits every setting alike
        for w in workers:
            runs[w].append(measure(make_loader(dataset, batch_size, w, **loader_kw), step, steps))
    return {w: monitor.merge(r) for w, r in runs.items()}


def table(mons: dict, fit: dict | None = None) -> list[dict]:
    """Return one row per setting: throughput, busy, wait, step, and (with a fit) predicted step and error."""
    rows = []
    for w, mon in mons.items():
        st = mon.stats()
        row = {"workers": w, "samples_per_s": round(st["samples_per_s"], 1), "busy": round(st["busy"], 3),
               "wait_ms": round(1e3 * st["wait"], 2), "compute_ms": round(1e3 * st["compute"], 2),
               "step_ms": round(1e3 * st["step"], 2)}
        if fit is not None and isinstance(w, int):
            p = predicted(fit, w)
            row.update(predicted_ms=round(1e3 * p, 2), model_error=round(abs(p - st["step"]) / st["step"], 3))
        rows.append(row)
    return rows


# --- plots ---------------------------------------------------------------------------------------------------
def plot_sweep(rows: list[dict], title: str = "", axes=None):
    """Plot throughput and busy fraction vs workers, and predicted vs measured step time if present."""
    import matplotlib.pyplot as plt
    n = 3 if "predicted_ms" in rows[0] else 2
    axes = axes if axes is not None else plt.subplots(1, n, figsize=(4.2 * n, 3.2))[1]
    w = [r["workers"] for r in rows]
    axes[0].plot(w, [r["samples_per_s"] for r in rows], "o-")
    axes[0].set(xlabel="workers", ylabel="samples/s", title=f"{title} throughput".strip())
    axes[1].plot(w, [100 * r["busy"] for r in rows], "o-", color="tab:green")
    axes[1].axhline(85, ls=":", color="gray")
    axes[1].set(xlabel="workers", ylabel="busy %", ylim=(0, 105), title="accelerator busy")
    if n == 3:
        axes[2].plot(w, [r["step_ms"] for r in rows], "o", label="measured")
        axes[2].plot(w, [r["predicted_ms"] for r in rows], "x--", label="max(t_load/W_eff, t_compute)")
        axes[2].set(xlabel="workers", ylabel="ms per step", ylim=(0, None), title="model vs measurement")
        axes[2].legend(fontsize=7)
    plt.tight_layout()
    return axes


def plot_timelines(mons: dict, labels: dict | None = None, seconds: float | None = None):
    """Draw one timeline per run, stacked, on a shared time axis (first `seconds` of each)."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(mons), 1, figsize=(10, 2.0 * len(mons)), sharex=True, squeeze=False)
    for ax, (k, mon) in zip(axes[:, 0], mons.items()):
        mon.plot(ax=ax, label=(labels or {}).get(k, f"num_workers={k}"))
        if seconds:
            ax.set_xlim(mon.steps[0].start, mon.steps[0].start + seconds)
    plt.tight_layout()
    return fig


# --- the benchmark -------------------------------------------------------------------------------------------
DEFAULT = {"size": 28, "fmt": "png", "io_ms": 0.6, "batch_size": 64}   # notebook 01 explains the mix


def bench(out_dir: Path, quick: bool) -> tuple[dict, str]:
    """Sweep num_workers on the default demo; write loading.png and loading_timeline.png; return (result, summary)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    torch.set_num_threads(1)                            # the "accelerator": one core trains, the rest can load
    torch.manual_seed(0)
    steps, rounds = (20, 1) if quick else (30, 3)
    workers = (0, 1, 2, 3, 4) if quick else (0, 1, 2, 3, 4, 6)
    store = make_store(steps * DEFAULT["batch_size"] + 256, DEFAULT["size"], DEFAULT["fmt"])
    step = make_step(make_model())
    mons = sweep(ImageDataset(store, DEFAULT["io_ms"]), step, workers, steps, DEFAULT["batch_size"], rounds)
    fit = fit_model(mons[0], mons[workers[-1]])
    rows = table(mons, fit)
    plot_sweep(rows, "default demo")
    plt.savefig(out_dir / "loading.png", dpi=110)
    best = max(rows, key=lambda r: r["busy"])
    plot_timelines({0: mons[0].runs[0], best["workers"]: mons[best["workers"]].runs[0]}, seconds=1.0)
    plt.savefig(out_dir / "loading_timeline.png", dpi=110)
    plt.close("all")
    worst = max(r["model_error"] for r in rows)
    speedup = best["samples_per_s"] / rows[0]["samples_per_s"]
    summary = (f"loading: busy {100 * rows[0]['busy']:.0f}% at num_workers=0, best {100 * best['busy']:.0f}% at "
               f"num_workers={best['workers']} ({speedup:.1f}x samples/s); model max(t_load/W_eff, t_compute) "
               f"within {100 * worst:.0f}% of measured step time (worst over W={workers[0]}..{workers[-1]})")
    result = {"settings": {**DEFAULT, "steps": steps, "rounds": rounds, "torch_threads": 1}, "fit": fit,
              "sweep": rows,
              "busy_at_0": rows[0]["busy"], "best_busy": best["busy"], "best_workers": best["workers"],
              "worst_model_error": worst}
    return result, summary


def plot_kinds(rows_by_name: dict):
    """Plot throughput (measured dots, model dashes) and busy % vs workers for several pipelines."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for name, rows in rows_by_name.items():
        w = [r["workers"] for r in rows]
        line, = axes[0].plot(w, [r["samples_per_s"] for r in rows], "o-", label=f"{name} (measured)")
        if "predicted_ms" in rows[0]:
            model = [r["samples_per_s"] * r["step_ms"] / r["predicted_ms"] for r in rows]
            axes[0].plot(w, model, "x--", color=line.get_color(), label=f"{name} (model)")
        axes[1].plot(w, [100 * r["busy"] for r in rows], "o-", color=line.get_color(), label=name)
    axes[0].set(xlabel="num_workers", ylabel="samples/s", title="throughput", ylim=(0, None))
    axes[1].set(xlabel="num_workers", ylabel="busy %", title="accelerator busy", ylim=(0, 105))
    axes[0].legend(fontsize=7)
    plt.tight_layout()
    return axes
