"""Is the accelerator starving? Per-step wait/compute intervals, NVML samples and the step-time model (notebook 01).

    with kit.data.monitor.Monitor() as mon:
        for x, y in mon.watch(loader, steps=50):   # time spent in next(loader) is "wait"
            train_step(x, y)                        # time until the loop asks again is "compute"
    print(mon.stats())                              # busy fraction, mean wait, throughput
    mon.plot()                                      # the timeline: saw-tooth when starving, flat when fed

The model that explains the numbers (notebook 01, section 4):

    step(W=0) = t_load + t_compute                                  # load, then compute, one after the other
    step(W>0) = max(t_load / W_eff, t_compute + t_handover)         # W workers load while the step computes
    W_eff     = min(W, cores * t_load / (t_load_cpu + c_compute))   # CPU work cannot use more cores than exist

where t_load_cpu is the CPU time inside t_load (decode, augment; the rest is waiting on I/O) and c_compute the
CPU time the training step itself burns per step (about t_compute on a CPU, little on a GPU); t_handover is
the wait for a batch a worker already has ready (receiving it from another process), 0 by default.
"""
from __future__ import annotations

import threading
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from kit.env import cpu_cores


NVML_LAG = 1.0      # s: an NVML utilisation reading averages its last sample period (1/6 s to 1 s, by product)


class NoNVMLWarning(UserWarning):
    """A CUDA GPU is here but NVML cannot be read: the monitor records the CPU-side wait/compute trace only."""


@lru_cache(maxsize=None)
def say_no_nvml():
    """Warn, once per process, that a GPU's NVML cannot be read: monitors record the CPU-side trace only."""
    warnings.warn("a CUDA GPU is here but NVML cannot be read (is nvidia-ml-py installed?): the monitor records "
                  "the CPU-side wait/compute trace only", NoNVMLWarning, stacklevel=3)


def cuda_present() -> bool:
    """Return whether PyTorch sees a CUDA GPU (without one, no NVML is expected and nothing is said)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def open_nvml(index: int = 0):
    """Return an NVML device handle's sampler `() -> (util %, memory used GiB)`, or None without NVML."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None

    def sample():
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        return float(util), pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30
    return sample


def batch_len(batch) -> int:
    """Return the number of samples in a batch (x, y), dict or array; 1 if it cannot tell."""
    first = batch[0] if isinstance(batch, (tuple, list)) else batch
    if isinstance(first, dict):
        first = next(iter(first.values()))
    try:
        return len(first)
    except TypeError:
        return 1


@dataclass
class Step:
    """One training step: when it started waiting, when the batch arrived, when compute ended; CPU seconds."""
    start: float
    ready: float
    end: float
    samples: int = 1
    wait_cpu: float = 0.0
    compute_cpu: float = 0.0

    @property
    def wait(self) -> float:
        return self.ready - self.start

    @property
    def compute(self) -> float:
        return self.end - self.ready


class Monitor:
    """Record per-step wait/compute intervals (and NVML samples on NVIDIA GPUs) inside a `with` block."""

    def __init__(self, warmup: int = 3, sample_s: float = 0.05, gpu: int = 0, nvml: bool = True,
                 sync=None, clock=time.perf_counter, cpu_clock=time.process_time):
        self.warmup, self.sample_s, self.gpu, self.sync = warmup, sample_s, gpu, sync
        self.clock, self.cpu_clock = clock, cpu_clock        # wall and CPU seconds (tests inject their own)
        self.use_nvml = nvml
        self.steps: list[Step] = []
        self.samples: list[tuple[float, float, float]] = []   # (t, GPU util %, memory GiB) from NVML
        self.has_nvml = False
        self.runs: list[Monitor] = []                         # the runs a merged Monitor was built from
        self.tree_cpu: tuple[float, int] | None = None        # (CPU s of this process's children, steps): steady
        self.t0 = None
        self._thread = None
        self._stop = threading.Event()

    # --- the with block and the NVML thread ------------------------------------------------------------
    def __enter__(self):
        self.t0 = time.perf_counter()
        sampler = open_nvml(self.gpu) if self.use_nvml else None
        self.has_nvml = sampler is not None
        if self.has_nvml:
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample_loop, args=(sampler,), daemon=True,
                                            name="kit-monitor-nvml")
            self._thread.start()
        elif self.use_nvml and cuda_present():          # a CPU-only machine has no NVML to miss: silent
            say_no_nvml()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return False

    def _sample_loop(self, sampler):
        while not self._stop.is_set():
            try:
                util, mem = sampler()
            except Exception:
                return
            self.samples.append((time.perf_counter() - self.t0, util, mem))
            self._stop.wait(self.sample_s)

    # --- recording ---------------------------------------------------------------------------------------
    def watch(self, iterable, steps: int | None = None):
        """Yield batches from `iterable`, timing the wait for each and the compute until the next request."""
        if self.t0 is None:
            self.t0 = self.clock()
        it, c0 = iter(iterable), None
        try:
            for _ in (range(steps) if steps is not None else iter(int, 1)):
                if c0 is None and len(self.steps) == self.warmup:
                    c0, n0 = children_cpu(), len(self.steps)     # the loader's workers, from the first steady step
                start, start_cpu = self.clock(), self.cpu_clock()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                ready, ready_cpu = self.clock(), self.cpu_clock()
                yield batch
                if self.sync is not None:
                    self.sync()                      # GPU: wait for queued kernels, else compute looks free
                end = self.clock()
                self.steps.append(Step(start - self.t0, ready - self.t0, end - self.t0, batch_len(batch),
                                       ready_cpu - start_cpu, self.cpu_clock() - ready_cpu))
        finally:
            if c0 is not None and len(self.steps) > n0:
                self.tree_cpu = (children_cpu() - c0, len(self.steps) - n0)
            close_loader_iterator(it)

    def record(self, wait_s: float, compute_s: float, samples: int = 1, wait_cpu: float = 0.0,
               compute_cpu: float = 0.0):
        """Append one step of known wait and compute durations (recorded runs, other frameworks, tests)."""
        start = self.steps[-1].end if self.steps else 0.0
        self.steps.append(Step(start, start + wait_s, start + wait_s + compute_s, samples, wait_cpu, compute_cpu))

    def keras_callback(self):
        """Return a Keras callback that records each batch: wait = gap before it, compute = the batch itself."""
        import keras
        mon = self
        if mon.t0 is None:
            mon.t0 = time.perf_counter()

        class StepTimer(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.last = time.perf_counter()

            def on_train_batch_begin(self, batch, logs=None):
                self.ready = time.perf_counter()

            def on_train_batch_end(self, batch, logs=None):
                end = time.perf_counter()
                mon.steps.append(Step(self.last - mon.t0, self.ready - mon.t0, end - mon.t0, 0))
                self.last = end
        return StepTimer()

    # --- results -----------------------------------------------------------------------------------------
    def steady(self) -> list[Step]:
        """Return the steps after the warm-up (worker start, first batches)."""
        return self.steps[self.warmup:] if len(self.steps) > self.warmup else list(self.steps)

    def stats(self, batch_size: int | None = None) -> dict:
        """Return busy fraction, mean wait/compute/step (s) and throughput over the steady steps."""
        s = self.steady()
        if not s:
            raise ValueError("no steps recorded: iterate through mon.watch(loader) inside the with block")
        wait = np.array([x.wait for x in s])
        compute = np.array([x.compute for x in s])
        elapsed = s[-1].end - s[0].start
        n = sum((batch_size or x.samples) for x in s)
        out = {"steps": len(s), "busy": float(compute.sum() / (wait.sum() + compute.sum())),
               "wait": float(wait.mean()), "compute": float(compute.mean()),
               "step": float((wait + compute).mean()), "steps_per_s": len(s) / elapsed,
               "samples_per_s": n / elapsed,
               "wait_cpu": float(np.mean([x.wait_cpu for x in s])),
               "compute_cpu": float(np.mean([x.compute_cpu for x in s]))}
        trees = [m.tree_cpu for m in (self.runs or [self]) if m.tree_cpu]
        if trees:                                   # the workers' CPU seconds per steady step
            out["workers_cpu"] = sum(c for c, _ in trees) / sum(n for _, n in trees)
        if self.samples:
            steady = self.steady_samples()
            out["gpu_util"] = float(np.mean([u for _, u, _ in steady]))
            out["gpu_util_samples"] = len(steady)
            out["gpu_mem_gib"] = float(max(m for _, _, m in self.samples))
        return out

    def steady_samples(self) -> list[tuple[float, float, float]]:
        """Return the NVML samples that read the steady steps: taken between the first steady step's start and the
        last one's end, less the first NVML_LAG s (a reading then still averages the workers' start and the
        warm-up). A short run keeps what it has inside its steady steps; a merged Monitor, each run's own."""
        if self.runs:
            return [x for run in self.runs for x in run.steady_samples()]
        steps = self.steady()
        if not steps:
            return list(self.samples)
        lo, hi = steps[0].start, steps[-1].end
        inside = [x for x in self.samples if lo <= x[0] <= hi]
        return [x for x in inside if x[0] >= lo + NVML_LAG] or inside or list(self.samples)

    def utilization(self, window: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
        """Return (time, % of each window spent computing): what nvidia-smi's utilization would show."""
        if not self.steps:
            return np.zeros(0), np.zeros(0)
        n = int(np.ceil((self.steps[-1].end - self.steps[0].start) / window - 1e-9))
        edges = self.steps[0].start + window * np.arange(n + 1)
        busy = np.zeros(len(edges) - 1)
        for s in self.steps:
            lo = np.clip(edges[:-1], s.ready, s.end)
            hi = np.clip(edges[1:], s.ready, s.end)
            busy += hi - lo
        return edges[:-1] + window / 2, 100 * busy / window

    def plot(self, ax=None, label: str = "", window: float = 0.05):
        """Draw the timeline (kit.plots.plot_monitor): compute green, wait red, busy % per window."""
        from kit.plots.data import plot_monitor
        return plot_monitor(self, ax=ax, label=label, window=window)


def children_cpu() -> float:
    """CPU seconds (user + system) used so far by this process's live children: a DataLoader's workers."""
    import psutil
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            total += t.user + t.system
        except psutil.Error:                    # ended meanwhile
            pass
    return total


def merge(mons: list) -> "Monitor":
    """Return one Monitor holding the steady steps of several runs, laid end to end (repeated measurements)."""
    out = Monitor(warmup=0, nvml=False)
    out.t0, out.runs, t = 0.0, list(mons), 0.0
    for mon in mons:
        steps = mon.steady()
        shift = t - steps[0].start
        out.steps += [Step(s.start + shift, s.ready + shift, s.end + shift, s.samples, s.wait_cpu, s.compute_cpu)
                      for s in steps]
        t0 = out.samples[-1][0] if out.samples else 0.0       # NVML samples too, laid end to end
        out.samples += [(t0 + ts, util, mem) for ts, util, mem in mon.samples]
        t = out.steps[-1].end
    return out


def close_loader_iterator(it):
    """Shut a torch DataLoader iterator's worker processes down now (others: close if they can)."""
    if getattr(it, "_persistent_workers", False):
        return                                          # the DataLoader reuses these workers next epoch
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    elif hasattr(it, "close"):
        it.close()


# --- the model ---------------------------------------------------------------------------------------------
def effective_workers(workers: int, t_load: float, t_load_cpu: float, c_compute: float,
                      cores: int | None = None) -> float:
    """Return W_eff = min(W, cores * t_load / (t_load_cpu + c_compute)): workers the CPU can actually feed."""
    cores = cores or cpu_cores()
    cpu_per_step = max(t_load_cpu + c_compute, 1e-12)
    return min(float(workers), cores * t_load / cpu_per_step)


def predict_step(workers: int, t_load: float, t_compute: float, t_load_cpu: float | None = None,
                 c_compute: float | None = None, cores: int | None = None, t_handover: float = 0.0,
                 t_compute_alone: float | None = None) -> float:
    """Predict the time per step with `workers` loader workers (0 = load in the training loop)."""
    if workers < 0:
        raise ValueError(f"workers must be >= 0 (0 loads in the main process), got {workers}")
    if workers == 0:                                   # take turns: load, then compute
        return t_load + (t_compute if t_compute_alone is None else t_compute_alone)
    t_load_cpu = t_load if t_load_cpu is None else t_load_cpu
    c_compute = t_compute if c_compute is None else c_compute
    w_eff = effective_workers(workers, t_load, t_load_cpu, c_compute, cores)
    return max(t_load / w_eff, t_compute + t_handover)   # overlap: the slower side sets the pace


def predict_busy(workers: int, t_load: float, t_compute: float, **kwargs) -> float:
    """Predict the busy fraction (time computing / time per step) with `workers` loader workers."""
    alone = kwargs.get("t_compute_alone")
    compute = alone if workers == 0 and alone is not None else t_compute
    return compute / predict_step(workers, t_load, t_compute, **kwargs)
