"""Horovod's timeline (HOROVOD_TIMELINE): read it, sum its phases, the exchange time per step (notebook 04).

    intervals = kit.mnist.timeline.read_timeline(path)          # {tensor, phase, depth, start, end} per phase
    kit.mnist.timeline.timeline_summary(intervals)               # seconds per phase, e.g. NEGOTIATE_ALLREDUCE
    kit.mnist.timeline.per_step(path)                            # each step: on the wire, negotiating, cycles
    rec = HorovodTimeline(); rec.start(); ...; steps = rec.stop()  # the same, recorded at run time (rank 0)
    kit.plots.plot_timeline(intervals, start=t, seconds=0.3)
"""
from __future__ import annotations

import json
import re
from pathlib import Path


def _events(path) -> list[dict]:
    text = Path(path).read_text().strip()
    if not text.endswith("]"):                      # Horovod leaves the list open while the job runs
        text = text.rstrip(",") + "]"
    return json.loads(text)


def read_cycles(path) -> list[float]:
    """Return the instants Horovod's background thread started a cycle (hvd.start_timeline(..., mark_cycles=True)),
    in seconds on read_timeline's clock (0 at the first interval's start)."""
    events = _events(path)
    t0 = min((ev["ts"] for ev in events if ev.get("ph") == "B"), default=0)
    return sorted((ev["ts"] - t0) / 1e6 for ev in events if ev.get("name") == "CYCLE_START")


def per_step(path) -> list[dict]:
    """Split a timeline of training steps at each negotiation of the step's first gradient; per step: its span
    (first negotiation to last allreduce done), the time some tensor was on the wire (the backend's allreduce) and
    the time some tensor was negotiating (waiting for every rank to report it ready), each instant counted once,
    the time neither (`idle`: the background thread between cycles, or waiting to run), the fused allreduces and
    the cycles. Seconds."""
    intervals, cycles = read_timeline(path), read_cycles(path)
    neg = [r for r in intervals if r["phase"].startswith("NEGOTIATE")]
    if not neg:
        return []
    first = neg[0]["tensor"]
    starts = [r["start"] for r in neg if r["tensor"] == first] + [float("inf")]
    out = []
    for a, b in zip(starts, starts[1:]):
        step = [r for r in intervals if a <= r["start"] < b]
        wire = [r for r in step if r["phase"] in ("GLOO_ALLREDUCE", "MPI_ALLREDUCE", "NCCL_ALLREDUCE")]
        end = max(r["end"] for r in step)
        neg = [(r["start"], r["end"]) for r in step if r["phase"].startswith("NEGOTIATE")]
        on_wire = [(r["start"], r["end"]) for r in wire]
        out.append({"span": end - a, "wire": wall_seconds(on_wire), "negotiation": wall_seconds(neg),
                    "idle": end - a - wall_seconds(on_wire + neg),
                    "allreduces": len({round(r["start"], 5) for r in wire}),
                    "cycles": sum(1 for c in cycles if a <= c < end)})
    return out


def read_timeline(path) -> list[dict]:
    """Parse a HOROVOD_TIMELINE file into intervals {tensor, phase, depth, start, end} (seconds, from 0)."""
    events = _events(path)
    names, stacks, out = {}, {}, []
    for ev in events:
        pid = ev.get("pid")
        if ev.get("ph") == "M" and ev.get("name") == "process_name" and "name" in ev.get("args", {}):
            names[pid] = ev["args"]["name"]
        elif ev.get("ph") == "B":
            stacks.setdefault(pid, []).append((ev["name"], ev["ts"]))
        elif ev.get("ph") == "E" and stacks.get(pid):
            phase, start = stacks[pid].pop()
            out.append({"tensor": short_tensor_name(names.get(pid, str(pid))), "phase": phase,
                        "depth": len(stacks[pid]), "start": start / 1e6, "end": ev["ts"] / 1e6})
    t0 = min((r["start"] for r in out), default=0.0)
    for r in out:
        r["start"], r["end"] = r["start"] - t0, r["end"] - t0
    return sorted(out, key=lambda r: (r["start"], r["depth"]))


def short_tensor_name(name: str) -> str:
    """Shorten TF's long op name to what it is, e.g. '...HorovodAllreduce_grads_6_0' -> 'grads_6'."""
    m = re.search(r"Horovod\w*?_(grads?_?\d*)(?:_\d+)?$", name)
    return m[1] if m else name.rsplit("/", 1)[-1][-24:]


def timeline_summary(intervals: list[dict]) -> dict[str, float]:
    """Return the total seconds spent in each phase, summed over tensors."""
    out: dict[str, float] = {}
    for r in intervals:
        out[r["phase"]] = out.get(r["phase"], 0.0) + r["end"] - r["start"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def wall_seconds(spans) -> float:
    """Return the wall-clock time covered by (start, end) spans that may overlap (each instant counted once)."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        total += max(0.0, end - max(start, reached))
        reached = max(reached, end)
    return total


def allreduce_seconds_per_step(intervals: list[dict], skip_steps: int = 0) -> float:
    """Return the data-exchange time per training step: the wall-clock time during which some gradient was in the
    backend's allreduce (GLOO_/MPI_/NCCL_ALLREDUCE: the transfer, not the negotiation or the fusion-buffer
    copies), divided by the steps seen. Fused tensors share one transfer, and tensors overlap in time: each instant
    counts once. `skip_steps`: leave out the first steps (warm-up: graph building, the first synchronisation)."""
    starts = sorted(r["start"] for r in intervals if r["phase"] == "ALLREDUCE" and r["tensor"] == "grads_0")
    if skip_steps and skip_steps >= len(starts):
        raise ValueError(f"the timeline has {len(starts)} steps: cannot leave out {skip_steps}")
    t0 = starts[skip_steps] if skip_steps else float("-inf")
    spans = [(r["start"], r["end"]) for r in intervals if r["phase"].endswith("_ALLREDUCE") and r["depth"] > 0
             and not r["phase"].startswith("NEGOTIATE") and r["tensor"].startswith("grads") and r["start"] >= t0]
    return wall_seconds(spans) / max(len(starts) - skip_steps, 1)


class HorovodTimeline:
    """Horovod's timeline of some steps, in a private temp file (where the engines started with
    HOROVOD_TIMELINE=DYNAMIC): start(), the steps, then stop() returns per_step of it on rank 0 (which writes it;
    None on the others, or where this Horovod cannot record one) and removes the file."""
    path = None

    def start(self):
        import os
        import tempfile
        import horovod.torch as hvd
        self.path = os.path.join(tempfile.gettempdir(), f"horovod-timeline-{os.getpid()}.json")
        try:
            hvd.start_timeline(self.path, mark_cycles=True)
        except ValueError:                        # started without HOROVOD_TIMELINE=DYNAMIC: no timeline
            self.path = None

    def stop(self) -> list[dict] | None:
        import os
        import horovod.torch as hvd
        if self.path is None:
            return None
        hvd.stop_timeline()
        if not os.path.exists(self.path):
            return None
        try:
            return per_step(self.path) if hvd.rank() == 0 else None
        finally:
            os.remove(self.path)


def overlap_check(together: int, n_tensors: int):
    """Return whether the median step's gradient allreduces overlapped backward: at least one of `n_tensors` started
    more than 2 ms before the last (`together` started within 2 ms of it)."""
    from kit.checks import Check
    return Check("allreduces started > 2 ms before the step's last", n_tensors - together, "≥ 1 (overlap)",
                 n_tensors - together >= 1)
