"""Horovod's timeline (HOROVOD_TIMELINE): read it, sum its phases, the exchange time per step (notebook 04).

    intervals = kit.mnist.timeline.read_timeline(path)          # {tensor, phase, depth, start, end} per phase
    kit.mnist.timeline.timeline_summary(intervals)               # seconds per phase, e.g. NEGOTIATE_ALLREDUCE
    kit.plots.plot_timeline(intervals, start=t, seconds=0.3)
"""
from __future__ import annotations

import json
import re
from pathlib import Path


def read_timeline(path) -> list[dict]:
    """Parse a HOROVOD_TIMELINE file into intervals {tensor, phase, depth, start, end} (seconds, from 0)."""
    text = Path(path).read_text().strip()
    if not text.endswith("]"):                      # Horovod leaves the list open while the job runs
        text = text.rstrip(",") + "]"
    events = json.loads(text)
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
