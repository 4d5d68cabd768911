"""Is the accelerator starving? Per-step wait/compute intervals, NVML samples, and a loader profiler (notebook 01).

    with kit.monitor.Monitor() as mon:
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

import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np


class NoNVMLWarning(UserWarning):
    """No NVIDIA driver/NVML here: the monitor records the CPU-side wait/compute trace only."""


def cpu_cores() -> int:
    """Return the number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@lru_cache(maxsize=None)
def say_no_nvml():
    """Warn, once per process, that there is no NVML: monitors record the CPU-side trace only."""
    warnings.warn("no NVIDIA GPU/NVML here: the monitor records the CPU-side wait/compute trace only",
                  NoNVMLWarning, stacklevel=3)


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
                 sync=None):
        self.warmup, self.sample_s, self.gpu, self.sync = warmup, sample_s, gpu, sync
        self.use_nvml = nvml
        self.steps: list[Step] = []
        self.samples: list[tuple[float, float, float]] = []   # (t, GPU util %, memory GiB) from NVML
        self.has_nvml = False
        self.runs: list[Monitor] = []                         # the runs a merged Monitor was built from
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
        elif self.use_nvml:
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
            self.t0 = time.perf_counter()
        it = iter(iterable)
        try:
            for _ in (range(steps) if steps is not None else iter(int, 1)):
                start, start_cpu = time.perf_counter(), time.process_time()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                ready, ready_cpu = time.perf_counter(), time.process_time()
                yield batch
                if self.sync is not None:
                    self.sync()                      # GPU: wait for queued kernels, else compute looks free
                end = time.perf_counter()
                self.steps.append(Step(start - self.t0, ready - self.t0, end - self.t0, batch_len(batch),
                                       ready_cpu - start_cpu, time.process_time() - ready_cpu))
        finally:
            close_loader_iterator(it)

    def record(self, wait_s: float, compute_s: float, samples: int = 1):
        """Append one step of known wait and compute durations (synthetic loops, other frameworks)."""
        start = self.steps[-1].end if self.steps else 0.0
        self.steps.append(Step(start, start + wait_s, start + wait_s + compute_s, samples))

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
        if self.samples:
            out["gpu_util"] = float(np.mean([u for _, u, _ in self.samples]))
            out["gpu_mem_gib"] = float(max(m for _, _, m in self.samples))
        return out

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
        """Draw the timeline: compute (green) and wait (red) intervals, and utilization per window."""
        import matplotlib.pyplot as plt
        ax = ax or plt.subplots(figsize=(10, 2.2))[1]
        ax.broken_barh([(s.ready, s.compute) for s in self.steps], (0, 8), color="tab:green")
        ax.broken_barh([(s.start, s.wait) for s in self.steps], (0, 8), color="tab:red")
        t, u = self.utilization(window)
        ax.plot(t, u, color="black", lw=1, label=f"busy % per {window * 1e3:.0f} ms")
        if self.samples:
            ts, us, _ = zip(*self.samples)
            ax.plot(ts, us, color="tab:purple", lw=1, label="NVML GPU utilization %")
        st = self.stats()
        ax.set(ylim=(0, 108), ylabel="%", xlabel="time (s)",
               title=f"{label}  busy {100 * st['busy']:.0f}%, mean wait {1e3 * st['wait']:.1f} ms")
        ax.legend(loc="lower right", fontsize=7)
        return ax


def merge(mons: list) -> "Monitor":
    """Return one Monitor holding the steady steps of several runs, laid end to end (repeated measurements)."""
    out = Monitor(warmup=0, nvml=False)
    out.t0, out.runs, t = 0.0, list(mons), 0.0
    for mon in mons:
        steps = mon.steady()
        shift = t - steps[0].start
        out.steps += [Step(s.start + shift, s.ready + shift, s.end + shift, s.samples, s.wait_cpu, s.compute_cpu)
                      for s in steps]
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


# --- profile my loader -------------------------------------------------------------------------------------
@dataclass
class LoaderProfile:
    """What profile_loader measured and what it recommends."""
    workers: int
    stall: float
    t_load: float
    t_load_cpu: float
    t_compute: float
    c_compute: float
    cores: int
    recommended_workers: int
    step_now: float
    step_predicted: float
    predicted: dict = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.step_now / self.step_predicted

    @property
    def cpu_bound(self) -> bool:
        return effective_workers(10**6, self.t_load, self.t_load_cpu, self.c_compute, self.cores) * \
            self.t_compute < self.t_load

    def __str__(self):
        io = 1 - self.t_load_cpu / self.t_load if self.t_load > 0 else 0.0
        lines = [f"loader with {self.workers} workers: the step waits {100 * self.stall:.0f}% of the time",
                 f"t_load {1e3 * self.t_load:.1f} ms/batch ({100 * io:.0f}% of it waiting on I/O), "
                 f"t_compute {1e3 * self.t_compute:.1f} ms/step, {self.cores} cores",
                 f"recommended: num_workers={self.recommended_workers} -> predicted "
                 f"{1e3 * self.step_predicted:.1f} ms/step, {self.speedup:.2f}x faster than now"]
        if self.cpu_bound:
            lines.append("CPU-bound: more workers cannot keep up on these cores; make each sample cheaper "
                         "(cache decoded data, smaller images, lighter augmentation) or add cores")
        return "\n".join(lines)


def recommend_workers(t_load: float, t_compute: float, t_load_cpu: float, c_compute: float,
                      cores: int | None = None, max_workers: int = 32) -> int:
    """Return the fewest workers whose predicted step is within 2% of the best any count can reach."""
    steps = {w: predict_step(w, t_load, t_compute, t_load_cpu, c_compute, cores) for w in range(max_workers + 1)}
    best = min(steps.values())
    return min(w for w, s in steps.items() if s <= 1.02 * best)


def serial_load_times(loader, batches: int = 5) -> tuple[float, float]:
    """Return (wall, CPU) seconds per batch when `loader` loads in this process (W=0)."""
    it = iter(loader)
    try:
        next(it)                                        # the first batch pays for start-up
        wall, cpu = time.perf_counter(), time.process_time()
        n = 0
        for _ in range(batches):
            try:
                next(it)
            except StopIteration:
                break
            n += 1
        if n == 0:
            raise ValueError("the loader has too few batches to time; give it at least two")
        return (time.perf_counter() - wall) / n, (time.process_time() - cpu) / n
    finally:
        close_loader_iterator(it)


def profile_loader(loader, step_fn, steps: int = 50, warmup: int = 3, cores: int | None = None,
                   max_workers: int = 32) -> LoaderProfile:
    """Run `step_fn(batch)` on `steps` batches; report the stall, t_load, t_compute and how many workers to use."""
    if steps < warmup + 2:
        raise ValueError(f"steps must be at least warmup + 2 = {warmup + 2}, got {steps}")
    workers = int(getattr(loader, "num_workers", 0) or 0)
    cores = cores or cpu_cores()
    with Monitor(warmup=warmup, nvml=False) as mon:
        for batch in mon.watch(loader, steps=steps):
            step_fn(batch)
    st = mon.stats()
    if workers > 0:                                     # the wait is what is left over, not the load time
        t_load, t_load_cpu = serial_load_times(serial_copy(loader))
    else:
        t_load, t_load_cpu = st["wait"], st["wait_cpu"]
    t_load_cpu = min(t_load_cpu, t_load)
    c_compute = min(st["compute_cpu"], st["compute"]) if st["compute_cpu"] > 0 else st["compute"]
    w = recommend_workers(t_load, st["compute"], t_load_cpu, c_compute, cores, max_workers)
    predicted = {k: predict_step(k, t_load, st["compute"], t_load_cpu, c_compute, cores)
                 for k in range(min(max_workers, 8) + 1)}
    return LoaderProfile(workers, 1 - st["busy"], t_load, t_load_cpu, st["compute"], c_compute, cores, w,
                         st["step"], predict_step(w, t_load, st["compute"], t_load_cpu, c_compute, cores),
                         predicted)


def serial_copy(loader):
    """Return a copy of a torch DataLoader that loads in the main process (num_workers=0)."""
    from torch.utils.data import DataLoader
    if not isinstance(loader, DataLoader):
        raise TypeError("a loader with num_workers > 0 must be a torch DataLoader to be re-timed serially")
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=loader.sampler,
                      collate_fn=loader.collate_fn, drop_last=loader.drop_last, num_workers=0)

