"""Notebook 04's accuracy lesson: do N workers reach one process's test accuracy? The seeds of `kit.bench mnist`
(results/mnist.json) give the spread; these functions read it, tabulate it and say what it shows."""
from __future__ import annotations

import json

import numpy as np

from kit.mnist.model import SCHEDULE
from kit.mnist.script import REPO


def accuracy_spread(dataset: str, subset, epochs: int, workers: int = 2) -> dict | None:
    """Return results/mnist.json's test accuracies per seed ({"2_workers": [...], "1_process": [...], CONTROL: [...],
    "long": ...}) when they were measured on the same data set, subset, epochs, optimizer and learning-rate schedule
    with `workers` workers; else None (nothing to compare with). "long" holds the runs with more epochs ({"epochs",
    "2_workers", "1_process"}), or None."""
    path = REPO / "results" / "mnist.json"
    x = json.loads(path.read_text()) if path.exists() else {}
    same = ((x.get("dataset"), x.get("subset"), x.get("epochs"), x.get("schedule")) ==
            (dataset, list(subset), epochs, SCHEDULE))
    seeds = x.get("accuracy_seeds")
    if same and workers == 2 and seeds and len(seeds["1_process"]) >= 2:
        return {**seeds, "long": x.get("accuracy_long")}
    return None


def accuracy_lesson(a2: list[float], a1: list[float]) -> tuple[bool, str]:
    """Judge N workers' seeds `a2` against one process's `a1`: held when the workers' median is within one
    process's range or above it. Return (held, what the seeds show, in words)."""
    med2, lo1, hi1 = float(np.median(a2)), min(a1), max(a1)
    if max(a2) < lo1:
        return False, "every 2-worker seed ended below every one-process seed: the lesson **did not hold**"
    if med2 >= lo1:
        return True, (f"the 2-workers' median, {med2:.2%}, is within one process's range ({lo1:.2%}–{hi1:.2%}) or "
                      "above it: the lesson **held**")
    return False, (f"the 2-workers' median, {med2:.2%}, is below one process's range ({lo1:.2%}–{hi1:.2%}), though "
                   "the ranges overlap: the lesson **did not hold**")


CONTROL = "1_process_as_2_workers"   # `kit.bench mnist`'s control arm: one process trained as the 2 workers are


def batch_control(seeds: dict) -> str | None:
    """What the control arm (one process, `--as-workers 2`: 2× the batch, 2× the rate, the 2 workers' warmup) says
    about the 2 workers' result against one process, in a sentence; None when the run has no control arm. The
    control matches the 2 workers when each median lies within the other's range."""
    ac, a2 = seeds.get(CONTROL), seeds["2_workers"]
    if not ac:
        return None
    said = (f"one process trained as the 2 workers are (2× the batch, 2× the learning rate, their warmup: "
            f"`--as-workers 2`) reached {_spread(ac)}, against the 2 workers' {_spread(a2)}: ")
    if not (_within(ac, a2) and _within(a2, ac)):
        return said + ("their medians are not each within the other's range: the larger batch alone does not "
                       "explain the workers' result")
    if accuracy_lesson(a2, seeds["1_process"])[0]:
        return said + ("each median within the other's range, and the workers' within one process's or above it: "
                       "neither the larger batch nor splitting it over workers cost accuracy that these seeds can see")
    return said + ("each median within the other's range. What the 2 workers lost, one process on their global "
                   "batch lost too: the gap is the larger batch's (half the steps, each on twice the images), "
                   "not the distribution's")


def _within(a: list[float], b: list[float]) -> bool:
    return min(b) <= float(np.median(a)) <= max(b)


def _spread(accs: list[float]) -> str:
    return f"{np.median(accs):.2%} ({min(accs):.2%}–{max(accs):.2%})"


def _arms(result: dict) -> list[tuple[int, dict]]:
    """(epochs, {"2_workers": [...], "1_process": [...]}) of the run's accuracy arms: the default, then the long."""
    arms = [(result["epochs"], result["accuracy_seeds"])]
    return arms + ([(result["accuracy_long"]["epochs"], result["accuracy_long"])] if result.get("accuracy_long")
                   else [])


def accuracy_table(result: dict) -> str:
    """Return the accuracy runs of a `python -m kit.bench mnist` run, one row per arrangement and epochs, one column
    per seed (docs/benchmarks/mnist.md; checked by test_packaging)."""
    out = [f"| {result['dataset']} | " + " | ".join(f"seed {s}" for s in result["seeds"]) + " | median | spread |",
           "|---|" + "---|" * (len(result["seeds"]) + 2)]
    for epochs, seeds in _arms(result):
        for key in ("2_workers", "1_process", CONTROL):
            accs = seeds.get(key)
            if not accs:
                continue
            out.append(f"| {key.replace('_', ' ')}, {epochs} epochs | " + " | ".join(f"{a:.2%}" for a in accs)
                       + f" | {np.median(accs):.2%} | {100 * (max(accs) - min(accs)):.2f} points |")
    return "\n".join(out)


def median_gap(a2: list[float], a1: list[float]) -> float:
    """Return the N workers' median accuracy minus one process's, in points."""
    return 100 * (float(np.median(a2)) - float(np.median(a1)))


def accuracy_claim(result: dict) -> str:
    """Return what the accuracy runs of a `python -m kit.bench mnist` run show, per arm (docs/benchmarks/mnist.md)."""
    out = []
    for epochs, seeds in _arms(result):
        a2, a1 = seeds["2_workers"], seeds["1_process"]
        control = batch_control(seeds)
        out.append(f"At {epochs} epochs {accuracy_lesson(a2, a1)[1]}; the medians differ by "
                   f"{median_gap(a2, a1):+.2f} points." + (f" The control: {control}." if control else ""))
    return (f"In this run (optimizer and learning-rate schedule: {result.get('schedule', 'warmup only')}). "
            + " ".join(out)
            + " Notebook 04 places its own run within these spreads and says whether its lesson held.")
