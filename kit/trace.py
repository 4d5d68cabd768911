"""torch.profiler traces: record a few steps, export Chrome trace JSON, read its spans back, and measure them.

    with kit.trace.profiler("w0.json.gz", wait=1, warmup=1, active=5) as prof:   # CPU (+ CUDA on a GPU host)
        for batch in loader:
            with kit.trace.compute():          # a record_function("compute") span around the step
                step(batch)
            if not prof.step():                # False once the schedule's active steps are recorded
                break
    tr = kit.trace.load("w0.json.gz")          # the same file Perfetto or chrome://tracing opens
    kit.trace.share(kit.trace.spans(tr, kit.trace.LOADER), kit.trace.spans(tr, kit.trace.STEP))   # data-wait share

A span is one complete event (``ph == "X"``) of the trace: a name, a start and a duration in microseconds, a
process and a thread. Shares, gaps and overlaps are computed on unions of intervals, so nested or repeated spans
(an op inside ``compute``, two collectives at once) are counted once. Notebook 01 reads the DataLoader's wait
out of its traces; notebook 05 the share of communication hidden behind backward (``hidden``, ``per_rank``).
"""
from __future__ import annotations

import gzip
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# Kineto prints "USDT: ... profiler_start/stop" lines on stderr at every cycle from torch 2.13; level 6 is above
# every level it logs at. Read when the first profiler starts, so setting it here (before any) is enough.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

STEP = r"^ProfilerStep#\d+$"                  # one span per prof.step(): the training step as the profiler sees it
LOADER = r"DataLoader.*__next__$"            # enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__ (or
                                             # _MultiProcessingDataLoaderIter): the step waiting for its batch
COMPUTE = r"^compute$"                       # the record_function span `compute()` puts around the training step
BACKWARD = r"^autograd::engine::evaluate_function: "       # one per backward op (the autograd engine's nodes)
COLLECTIVE = r"^(gloo|nccl|mpi|ucc):|^(all_?reduce|reduce_?scatter|all_?gather|broadcast)"   # the work itself:
# Gloo's `gloo:all_reduce` runs on its own threads, from launch to completion (waiting for peers included)
LAUNCH = r"^c10d::"                          # c10d::allreduce_ etc.: the calling thread only launches the work
KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")   # device activity in a CUDA trace
EVENT_KEYS = ("ph", "ts", "dur", "name", "pid", "tid")


@dataclass(frozen=True)
class Span:
    """One complete event of a trace: name, start and duration (µs), process, thread, category."""
    name: str
    start: float
    dur: float
    pid: object = 0
    tid: object = 0
    cat: str = ""

    @property
    def end(self) -> float:
        return self.start + self.dur


# --- recording ------------------------------------------------------------------------------------------------
class Recording:
    """A running torch.profiler on a wait/warmup/active schedule; `step()` says whether to go on."""

    def __init__(self, prof, total: int):
        self.prof, self.total, self.done = prof, total, 0

    def step(self) -> bool:
        """Mark the end of one training step; return False once the schedule's last active step is recorded."""
        self.prof.step()
        self.done += 1
        return self.done < self.total


@contextmanager
def profiler(path, wait: int = 1, warmup: int = 1, active: int = 5, cuda: bool | None = None):
    """Profile inside the block on schedule(wait, warmup, active, repeat=1); export Chrome trace JSON to `path`
    (``.json`` or ``.json.gz``) when the active steps end. CPU activity always, CUDA's too on a GPU (cuda=None)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule
    for name, value, least in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1)):
        if not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an integer >= {least} (steps of the schedule), got {value!r}")
    path = Path(path)
    if not path.name.endswith((".json", ".json.gz")):
        raise ValueError(f"path must end in .json or .json.gz (Chrome trace JSON), got {str(path)!r}")
    cuda = torch.cuda.is_available() if cuda is None else cuda
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    path.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        yield Recording(prof, wait + warmup + active)


def compute(name: str = "compute"):
    """Return a record_function span to put around the training step (the trace's `COMPUTE` lane)."""
    from torch.profiler import record_function
    return record_function(name)


def record_loop(loader, step, path, wait: int = 1, warmup: int = 1, active: int = 5, cuda: bool | None = None,
                sync=None) -> Path:
    """Train `step(batch)` on `loader` under `profiler(...)` for wait + warmup + active steps, each inside a
    `compute` span (`sync()` inside it on a GPU); shut the loader's workers down; return the trace's path."""
    it = iter(loader)
    try:
        with profiler(path, wait, warmup, active, cuda) as rec:
            for batch in it:
                with compute():
                    step(batch)
                    if sync is not None:
                        sync()
                if not rec.step():
                    break
        if rec.done < rec.total:
            raise ValueError(f"the loader gave {rec.done} batches; the schedule needs {rec.total} "
                             f"(wait {wait} + warmup {warmup} + active {active})")
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
    return Path(path)


# --- reading ----------------------------------------------------------------------------------------------------
def load(trace) -> dict:
    """Return a Chrome trace as a dict with a `traceEvents` list: from a path (.json or .json.gz), a dict, or a
    bare list of events; raise ValueError if it is not Chrome trace JSON."""
    if isinstance(trace, (str, Path)):
        opener = gzip.open if str(trace).endswith(".gz") else open
        with opener(trace, "rt") as f:
            trace = json.load(f)
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("a Chrome trace is a JSON object with a 'traceEvents' list (or that list itself)")
    return trace


def invalid_events(trace) -> list[str]:
    """Return what makes `trace` not valid Chrome trace JSON for a viewer (empty when it is): every complete
    event ('X') needs ph, ts, dur, name, pid and tid, with numeric ts and dur >= 0."""
    bad = []
    for i, e in enumerate(load(trace)["traceEvents"]):
        if not isinstance(e, dict) or "ph" not in e:
            bad.append(f"event {i}: no 'ph'")
        elif e["ph"] == "X":
            missing = [k for k in EVENT_KEYS if k not in e]
            if missing:
                bad.append(f"event {i} ({e.get('name')!r}): missing {', '.join(missing)}")
            elif not isinstance(e["ts"], (int, float)) or not isinstance(e["dur"], (int, float)) or e["dur"] < 0:
                bad.append(f"event {i} ({e['name']!r}): ts and dur must be numbers, dur >= 0")
    return bad


def spans(trace, name: str | None = None, cat: str | None = None, tid=None) -> list[Span]:
    """Return the complete events of `trace` whose name matches the regular expression `name` (all if None),
    of category `cat` and thread `tid` if given, sorted by start."""
    pattern = re.compile(name) if name is not None else None
    out = [Span(e["name"], float(e["ts"]), float(e.get("dur", 0.0)), e.get("pid", 0), e.get("tid", 0),
                e.get("cat", "")) for e in load(trace)["traceEvents"]
           if isinstance(e, dict) and e.get("ph") == "X" and (pattern is None or pattern.search(e.get("name", "")))
           and (cat is None or e.get("cat") == cat) and (tid is None or e.get("tid") == tid)]
    return sorted(out, key=lambda s: s.start)


def names(trace) -> set[str]:
    """Return the names of the trace's complete events."""
    return {s.name for s in spans(trace)}


# --- measuring ---------------------------------------------------------------------------------------------------
def union(intervals) -> list[tuple[float, float]]:
    """Return the union of (start, end) intervals (or Spans) as sorted, disjoint (start, end) pairs."""
    pairs = sorted((s.start, s.end) if isinstance(s, Span) else (float(s[0]), float(s[1])) for s in intervals)
    out: list[list[float]] = []
    for a, b in pairs:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        elif b > a:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals) -> float:
    """Return the total length covered by the intervals (overlaps counted once)."""
    return sum(b - a for a, b in union(intervals))


def intersect(a, b) -> list[tuple[float, float]]:
    """Return the union of `a` intersected with the union of `b`, as disjoint (start, end) pairs."""
    ua, ub, out, j = union(a), union(b), [], 0
    for lo, hi in ua:
        while j < len(ub) and ub[j][1] <= lo:
            j += 1
        k = j
        while k < len(ub) and ub[k][0] < hi:
            s, e = max(lo, ub[k][0]), min(hi, ub[k][1])
            if e > s:
                out.append((s, e))
            k += 1
    return out


def share(inner, outer) -> float:
    """Return the share of the outer spans' time covered by the inner spans (e.g. the loader's wait in the steps)."""
    total = length(outer)
    if total <= 0:
        raise ValueError("the outer spans cover no time: is the pattern right and did the profiler record steps?")
    return length(intersect(inner, outer)) / total


def gaps(spans_, within) -> list[tuple[float, float]]:
    """Return the stretches of `within` that no span of `spans_` covers (e.g. the steps' time outside compute)."""
    covered, out = union(spans_), []
    for lo, hi in union(within):
        t = lo
        for a, b in covered:
            if b <= t or a >= hi:
                continue
            if a > t:
                out.append((t, a))
            t = max(t, b)
        if t < hi:
            out.append((t, hi))
    return out


def hidden(comm, compute_) -> float:
    """Return the share of the communication spans' time that runs while compute spans run (overlap / comm)."""
    total = length(comm)
    if total <= 0:
        raise ValueError("no communication spans: is the pattern right (kit.trace.COLLECTIVE)?")
    return length(intersect(comm, compute_)) / total


def per_rank(traces: dict, comm: str = COLLECTIVE, compute_: str = BACKWARD) -> dict:
    """For {rank: trace}, return {rank: {"comm_ms", "compute_ms", "hidden_ms", "hidden"}}: each rank's collectives
    against its backward ops (all threads of its process), and the share of communication hidden behind backward."""
    out = {}
    for rank, trace in traces.items():
        c, b = spans(trace, comm), spans(trace, compute_)
        if not c:
            raise ValueError(f"rank {rank}: no span matches comm={comm!r}; names in its trace: "
                             f"{', '.join(sorted(names(trace))[:12])}, ...")
        both = length(intersect(c, b))
        out[rank] = {"comm_ms": length(c) / 1e3, "compute_ms": length(b) / 1e3, "hidden_ms": both / 1e3,
                     "hidden": both / length(c)}
    return out


def origin(traces) -> float:
    """Return the earliest span start (µs) over several traces: one time axis for all ranks of one host."""
    starts = [s.start for t in traces for s in spans(t)]
    if not starts:
        raise ValueError("no complete events in these traces")
    return min(starts)


def data_wait(trace, loader: str = LOADER, step: str = STEP) -> dict:
    """Return the steps' data wait from a trace: {"steps", "step_ms" (mean), "wait_ms" (mean per step),
    "wait_share" (the loader's time / the steps' time), "compute_share" (the `compute` spans' / the steps')}."""
    st, ld, cp = spans(trace, step), spans(trace, loader), spans(trace, COMPUTE)
    if not st:
        raise ValueError(f"no span matches step={step!r}: was the loop profiled with prof.step() each step?")
    if not ld:
        raise ValueError(f"no span matches loader={loader!r}: did the loop iterate a torch DataLoader?")
    total = length(st)
    return {"steps": len(st), "step_ms": total / len(st) / 1e3,
            "wait_ms": length(intersect(ld, st)) / len(st) / 1e3, "wait_share": share(ld, st),
            "compute_share": share(cp, st) if cp else 0.0}


def device_busy(trace, within: str = STEP) -> float:
    """Return the share of the steps' time with a kernel or copy running on the GPU (a CUDA trace): what NVML's
    utilisation counts (a period with at least one kernel running), read from the trace."""
    kernels = [s for s in spans(trace) if s.cat in KERNEL_CATS]
    if not kernels:
        raise ValueError("no GPU kernels in this trace: record it with CUDA activity (cuda=True) on a GPU host")
    return share(kernels, spans(trace, within))
