"""Profile my loader: is the step starving, and how many workers would feed it? (notebook 01, section 6)

    prof = kit.profile_loader(loader, train_step, steps=50)   # runs 50 steps inside a kit.data.monitor.Monitor
    print(prof)                                              # stall, t_load, t_compute, recommended num_workers

The recommendation comes from the step-time model of ``kit.data.monitor`` (predict_step), fitted to the run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from kit.env import cpu_cores
from kit.data.monitor import Monitor, close_loader_iterator, effective_workers, predict_step


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
        rows = [("num_workers", self.workers), ("stall (wait share)", f"{self.stall:.0%}"),
                ("t_load ms/batch", f"{1e3 * self.t_load:.1f}"), ("of t_load, I/O wait", f"{io:.0%}"),
                ("t_compute ms/step", f"{1e3 * self.t_compute:.1f}"), ("cores", self.cores),
                ("recommended num_workers", self.recommended_workers),
                ("predicted ms/step", f"{1e3 * self.step_predicted:.1f}"),
                ("predicted speed-up", f"{self.speedup:.2f}x"),
                ("CPU-bound", self.cpu_bound)]
        return "\n".join(f"{k:<24} {v}" for k, v in rows)


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
    with Monitor(warmup=warmup, nvml=False) as mon:
        for batch in mon.watch(loader, steps=steps):
            step_fn(batch)
    serial = serial_load_times(serial_copy(loader)) if workers > 0 else None   # the wait is what is left over
    return profile(mon, workers, cores, max_workers, serial)


def profile(mon: Monitor, workers: int = 0, cores: int | None = None, max_workers: int = 32,
            serial: tuple[float, float] | None = None) -> LoaderProfile:
    """Turn a recorded run (its loader had `workers` workers) into a LoaderProfile and a recommendation.

    serial: (wall, CPU) seconds per batch loading in the training loop; without it the run's wait is t_load
    (right for workers=0 only).
    """
    cores = cores or cpu_cores()
    st = mon.stats()
    t_load, t_load_cpu = serial if serial is not None else (st["wait"], st["wait_cpu"])
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

