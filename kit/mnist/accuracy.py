"""Notebook 04's accuracy lesson: do N workers reach one process's test accuracy? The seeds of `kit.bench mnist`
(results/mnist.json) give the spread; these functions read it, tabulate it and check it. The lesson on the
notebook's own run (run_checks) and the linear scaling rule it rests on (scaling_checks) are kit.checks values."""
from __future__ import annotations

import json

import numpy as np

from kit.checks import Check
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


CONTROL = "1_process_as_2_workers"   # `kit.bench mnist`'s control arm: one process trained as the 2 workers are


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


def _median_check(name: str, a2: list[float], a1: list[float]) -> Check:
    """Return whether the median of `a2` (accuracies) reaches the lowest of `a1` (within one's range or above)."""
    return Check(name, f"{100 * float(np.median(a2)):.2f}%", f"≥ {100 * min(a1):.2f}%", float(np.median(a2)) >= min(a1))


def seeds_checks(seeds: dict, epochs: int) -> list[Check]:
    """Return the benchmark's checks on one arm's seeds ({"2_workers", "1_process", CONTROL?}): the workers' median
    within one process's range or above it; with a control arm (one process trained as the 2 workers are), the
    control's median within the workers' range (the larger batch alone explains them)."""
    a2, a1, ac = seeds["2_workers"], seeds["1_process"], seeds.get(CONTROL)
    out = [_median_check(f"{epochs} epochs: 2 workers' median vs one process's lowest", a2, a1)]
    if ac:
        med = float(np.median(ac))
        out.append(Check(f"{epochs} epochs: control's median within the workers' range", f"{100 * med:.2f}%",
                         f"{100 * min(a2):.2f}–{100 * max(a2):.2f}%", min(a2) <= med <= max(a2)))
    return out


def bench_checks(result: dict) -> list[Check]:
    """Return seeds_checks for every accuracy arm of a `python -m kit.bench mnist` run (docs/benchmarks/mnist.md)."""
    return [c for epochs, seeds in _arms(result) for c in seeds_checks(seeds, epochs)]


# ---------------------------------------------------------------------------------- the linear scaling rule
SCALING_TOL = 0.02    # the rule holds at batch ×k when its accuracy is within 2 points of the base batch's


def scaling_checks(base: float, scaled: dict[int, float], tol: float = SCALING_TOL) -> list[Check]:
    """Return one check per k of `scaled` ({k: accuracy at batch ×k with the learning rate ×k}): held when within
    `tol` of `base`, the accuracy at the base batch on the same samples."""
    return [Check(f"linear scaling rule, batch ×{k}", round(100 * acc, 1), f"≥ {100 * (base - tol):.1f}%",
                  bool(acc >= base - tol), unit="%") for k, acc in scaled.items()]


# ---------------------------------------------------------------------------------- the lesson on the notebook's run
def run_checks(run: dict, spread: dict | None) -> list[Check]:
    """Return the lesson's checks on the notebook's `run` ({workers, acc_n, acc_1}) against the benchmark's seeds
    `spread` (accuracy_spread): this run's workers at least the lower of one process's seeds and this run's one
    process; the seeds' workers' median within one process's range or above it; the control arm; with
    spread["long"], the same at more epochs. [] without seeds."""
    if not spread:
        return []
    n, a1 = run["workers"], spread["1_process"]
    floor = min(min(a1), run["acc_1"])
    out = [Check(f"this run: {n} workers vs one process's lowest", f"{100 * run['acc_n']:.2f}%",
                 f"≥ {100 * floor:.2f}%", bool(run["acc_n"] >= floor))]
    out += seeds_checks(spread, run["epochs"])
    if spread.get("long"):
        out += seeds_checks(spread["long"], spread["long"]["epochs"])[:1]
    return out
