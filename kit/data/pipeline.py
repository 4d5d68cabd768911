"""A realistic input pipeline: encoded images decoded and augmented per sample, optional read latency (notebook 01).

    store = kit.data.make_store(2048, size=28, fmt="png")        # the "disk": PNG/JPEG bytes + labels
    ds = kit.data.ImageDataset(store, io_ms=0.5)                  # per sample: read (sleep) -> decode -> augment
    loader = kit.data.make_loader(ds, batch_size=64, num_workers=2)

Two kinds of cost, and they behave differently on a machine with few cores:
- CPU work (PNG/JPEG decode, crop/flip/affine, normalise) needs a free core; W workers on 2 cores cannot
  decode faster than 2 cores can, and they compete with the training step for those cores.
- I/O latency (`io_ms`, a sleep standing in for a disk or network read) needs no core; W workers overlap W
  reads, so it parallelises past the core count.
The same pipeline for Keras 3 (a `keras.utils.PyDataset`) and tf.data is in `kit.data.tfdata`. Notebook 01 and
`python -m kit.bench loading` run the same experiment, `sweep_experiment`, with their settings as arguments.
"""
from __future__ import annotations

import io
import re
import time
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

from kit.data import monitor

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
    from kit import datasets
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


def checked_sample(store: ImageStore, i: int, io_ms: float = 0.0, seed: int = 0):
    """load_sample, raising SampleError naming the index if it fails."""
    try:
        return load_sample(store, i, io_ms, seed)
    except Exception as e:
        raise SampleError(f"sample {i} failed to load: {type(e).__name__}: {e}") from e


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


def make_model(width: int = 1) -> nn.Module:
    """Return the small CNN every run trains (two conv blocks, two dense layers; 28x28x1 in, 10 classes); `width`
    multiplies its channels and units (a GPU needs a wider one for its step to be what the loader must feed)."""
    c1, c2, d = 32 * width, 64 * width, 128 * width
    return nn.Sequential(nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(c2 * 7 * 7, d), nn.ReLU(), nn.Linear(d, 10))


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


def queued(loader) -> int:
    """Return how many batches `loader`'s workers may hold ready ahead of the step: num_workers x prefetch_factor."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    return workers * int(getattr(loader, "prefetch_factor", None) or 2) if workers else 0


def measure(loader, step, steps: int = 40, warmup: int = 3) -> monitor.Monitor:
    """Train from `loader` inside a Monitor and return it (stats(), plot()): `warmup` steps, plus as many as the
    workers may have queued, then `steps - warmup` counted steps. Batches the workers loaded during their start-up
    would otherwise be counted as if loaded at the steady rate: a short run then beats the loader's own pace."""
    ahead = queued(loader)
    with monitor.Monitor(warmup=warmup + ahead, sync=sync_fn()) as mon:   # NVML on a GPU, CPU trace only elsewhere
        for batch in mon.watch(loader, steps=steps + ahead):
            step(batch)
    return mon


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


def table(mons: dict, fit: dict | None = None, predict=None) -> list[dict]:
    """Return one row per setting: throughput, busy, wait, step, and (with a fit) predicted step and error. A merged
    Monitor (from `sweep`'s rounds) also gives each round's samples/s and step ms ("rounds": [[samples/s, ms], ...])
    and the spread of its step time over the rounds ("step_spread": (max - min) / the merged step).
    predict(workers, **fit) -> seconds: the model to predict with (default the kit's, `monitor.predict_step`)."""
    predict = predict or monitor.predict_step
    rows = []
    for w, mon in mons.items():
        st = mon.stats()
        per_round = [r.stats() for r in getattr(mon, "runs", [])] or [st]
        steps = [r["step"] for r in per_round]
        row = {"workers": w, "samples_per_s": round(st["samples_per_s"], 1), "busy": round(st["busy"], 3),
               "wait_ms": round(1e3 * st["wait"], 2), "compute_ms": round(1e3 * st["compute"], 2),
               "step_ms": round(1e3 * st["step"], 2), "cpu_ms": round(1e3 * (st["wait_cpu"] + st["compute_cpu"]), 2),
               "workers_cpu_ms": round(1e3 * st["workers_cpu"], 2) if "workers_cpu" in st else None,
               "rounds": [[round(r["samples_per_s"], 1), round(1e3 * r["step"], 2)] for r in per_round],
               "step_spread": round((max(steps) - min(steps)) / st["step"], 3)}
        if fit is not None and isinstance(w, int):
            p = predict(w, **fit)
            row.update(predicted_ms=round(1e3 * p, 2), model_error=round(abs(p - st["step"]) / st["step"], 3))
        rows.append(row)
    return rows


def text_table(rows: list[dict], columns: dict[str, str]) -> str:
    """Return `rows` as an aligned text table; `columns` maps each header to a format over a row's keys, e.g.
    {"W": "{workers}", "busy": "{busy:.0%}"}."""
    cells = [list(columns)] + [[spec.format(**r) for spec in columns.values()] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


SWEEP_COLUMNS = {"W": "{workers}", "samples/s": "{samples_per_s:.0f}", "busy": "{busy:.0%}", "wait ms": "{wait_ms:.1f}",
                 "compute ms": "{compute_ms:.1f}", "step ms": "{step_ms:.1f}", "model ms": "{predicted_ms:.1f}",
                 "error": "{model_error:.0%}"}


# --- the experiment of notebook 01 and `python -m kit.bench loading` -----------------------------------------
DEFAULT = {"size": 28, "fmt": "png", "io_ms": 0.6, "batch_size": 64}   # notebook 01 explains the mix
AHEAD = 40          # batches a store holds beyond a run's steps: those `measure` skips while workers' queues drain


def setup(steps: int = 30, size: int = DEFAULT["size"], fmt: str = DEFAULT["fmt"], io_ms: float = DEFAULT["io_ms"],
          batch_size: int = DEFAULT["batch_size"], torch_threads: int = 1, seed: int = 0, verbose: bool = False):
    """Return (store, dataset, step) for a sweep of `steps` steps: the stored images, the pipeline, one SGD step.

    torch_threads: threads the training step may use (the "accelerator"; the other cores can load).
    """
    torch.set_num_threads(torch_threads)
    torch.manual_seed(seed)
    store = make_store((steps + AHEAD) * batch_size, size, fmt, verbose=verbose)   # the queued batches' too
    return store, ImageDataset(store, io_ms), make_step(make_model())


def sweep_experiment(dataset, step, workers=(0, 1, 2, 4), steps: int = 30, batch_size: int = DEFAULT["batch_size"],
                     rounds: int = 2, fit_workers: tuple[int, int] | None = None) -> dict:
    """Sweep num_workers, fit the step-time model to two of the runs, predict the others, tabulate; return all.

    fit_workers: (0, W) — the runs the model is fitted to (default: 0 and the largest W). Returns {"mons": {W:
    merged Monitor}, "fit": fit_model's numbers, "fit_workers", "rows": table(...), "best": the row with the most
    samples/s, "speedup": its samples/s over W=0's, "held_out_error": the model's largest error on the W it was
    NOT fitted to (None if there are none)}.
    """
    if 0 not in workers:
        raise ValueError(f"workers must include 0 (the model is fitted to loading in the training loop), got {workers}")
    fit_workers = tuple(fit_workers or (0, max(workers)))
    if len(fit_workers) != 2 or fit_workers[0] != 0 or fit_workers[1] not in workers or fit_workers[1] == 0:
        raise ValueError(f"fit_workers must be (0, W) with W > 0 one of workers={workers}, got {fit_workers}")
    mons = sweep(dataset, step, workers, steps, batch_size, rounds)
    fit = fit_model(mons[0], mons[fit_workers[1]])
    rows = table(mons, fit)
    best = max(rows, key=lambda r: r["samples_per_s"])     # judged by throughput: busy alone can rise as steps slow
    zero = next(r for r in rows if r["workers"] == 0)
    held_out = [r["model_error"] for r in rows if r["workers"] not in fit_workers]
    return {"mons": mons, "fit": fit, "fit_workers": fit_workers, "rows": rows, "best": best, "at_0": zero,
            "speedup": best["samples_per_s"] / zero["samples_per_s"],
            "held_out_error": max(held_out) if held_out else None}
