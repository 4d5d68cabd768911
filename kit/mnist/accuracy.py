"""Notebook 04's accuracy lesson: do N workers reach one process's test accuracy? The seeds of `kit.bench mnist`
(results/mnist.json) give the spread; these functions read it, tabulate it and say what it shows. The lesson on the
notebook's own run (run_checks, run_note) and the linear scaling rule it rests on (scaling_checks, scaling_note) are
kit.checks values rendered by kit.checks.markdown."""
from __future__ import annotations

import json

import numpy as np

from kit.checks import Check, markdown
from kit.mnist.model import BATCH, SCHEDULE
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


# ---------------------------------------------------------------------------------- the linear scaling rule
SCALING_TOL = 0.02    # the rule holds at batch ×k when its accuracy is within 2 points of the base batch's

RULE_LIMITS = ("The rule rests on the gradient changing little over k small steps; it breaks when k·η exceeds the "
               "largest learning rate the network tolerates (early in training most of all, which is what warmup "
               "eases) and when so few steps remain that the large batch cannot make up for them. Goyal et al. found "
               "the limit near a batch of 8k images for ResNet-50 on ImageNet; on a tiny problem it comes much sooner.")


def scaling_checks(base: float, scaled: dict[int, float], batch: int, lr: float, samples: int,
                   tol: float = SCALING_TOL) -> list[Check]:
    """Return one check per k of `scaled` ({k: accuracy at batch ×k with the learning rate ×k}): held when within
    `tol` of `base`, the accuracy at `batch` and `lr` on the same `samples` samples."""
    return [Check(f"the linear scaling rule at batch ×{k}", measured=f"{acc:.1%}",
                  bound=f"within {100 * tol:.0f} points of the base batch's {base:.1%}", held=bool(acc >= base - tol),
                  reason=f"{samples // (batch * k):,} steps of {batch * k} samples at learning rate {lr * k:g} fell "
                         f"{100 * (base - acc):.1f} points short of {samples // batch:,} steps of {batch} at {lr:g}")
            for k, acc in scaled.items()]


def scaling_note(base: float, plain: dict[int, float], scaled: dict[int, float], batch: int, lr: float,
                 samples: int) -> str:
    """Return the scaling experiment's account: the base batch, batch ×k without and with the rule (`plain`,
    `scaled`: {k: accuracy}) as checks, and where the rule breaks."""
    without = " and ".join(f"×{k} reached {acc:.1%}" for k, acc in plain.items())
    return (f"With the same {samples:,} samples, batch {batch} reached {base:.1%}. Without scaling the learning rate, "
            f"batch {without}: fewer steps of the same size cover less ground. With the rule (the better of with and "
            f"without warmup):\n\n" + markdown(scaling_checks(base, scaled, batch, lr, samples)) + "\n\n"
            + RULE_LIMITS)


# ---------------------------------------------------------------------------------- the lesson on the notebook's run
def run_checks(run: dict, spread: dict | None) -> list[Check]:
    """Return the lesson's checks on the notebook's `run` ({workers, epochs, n_train, acc_n, acc_1, steps_n,
    steps_1}) against the benchmark's seeds `spread` (accuracy_spread): this run's workers within one process's
    spread or above it; when they were, the seeds' workers too; when either failed, the seeds with more epochs
    (spread["long"]), if any. [] without seeds."""
    if not spread:
        return []
    n, e, a2, a1 = run["workers"], run["epochs"], spread["2_workers"], spread["1_process"]
    floor = min(min(a1), run["acc_1"])
    checks = [Check(
        f"{n} workers reach one process's accuracy on this run",
        measured=f"{n} workers {run['acc_n']:.1%}, one process {run['acc_1']:.1%}",
        bound=f"within one process's spread or above it: at least {floor:.1%}, the lower of its seeds' lowest and "
              "this run's",
        held=bool(run["acc_n"] >= floor), reason=_behind_reason(run, a2))]
    if checks[0].held:
        checks.append(_seeds_check(f"{n} workers reach one process's accuracy over the benchmark's seeds", a2, a1,
                                   n, if_not="This run fell on the good side of the spread"))
    if not all(c.held for c in checks) and spread.get("long"):
        checks.append(long_check(spread["long"], e, n))
    return checks


def _behind_reason(run: dict, a2: list[float]) -> str:
    """Say why this run's workers fell below one process: inside the spread of the workers' own seeds `a2` (their
    range, widened by its own width), or below that too, where the fewer, larger steps are the suspect."""
    n, e, acc = run["workers"], run["epochs"], run["acc_n"]
    lo, hi = min(a2), max(a2)
    steps = (f"the job took {e * run['steps_n']} optimizer steps against one process's {e * run['steps_1']} ({n}× "
             f"fewer, each on {n}× the batch with {n}× the learning rate)")
    if acc >= lo - (hi - lo):
        where = "within" if acc >= lo else f"{100 * (lo - acc):.1f} points below"
        return (f"this run's {n} workers ({acc:.1%}) fell {where} the range of their own {len(a2)} seeds "
                f"({lo:.1%}–{hi:.1%}): the gap is the seeds' run-to-run spread, not shown to come from the workers. "
                f"(Also, {steps}: the benchmark's seeds and its control arm, below, say whether that cost accuracy)")
    return (f"{steps}, and this run's {n} workers ({acc:.1%}) fell below their own {len(a2)} seeds too ({lo:.1%}–"
            f"{hi:.1%}): on {run['n_train']:,} images in {e} epochs those fewer, larger steps did not catch up "
            "(the curves above)")


def _seeds_check(name: str, a2: list[float], a1: list[float], n: int, if_held: str = "", if_not: str = "") -> Check:
    """Return accuracy_lesson's verdict on seeds `a2` (N workers) against `a1` (one process) as a check, its detail
    `if_held` or `if_not`."""
    held = accuracy_lesson(a2, a1)[0]
    med = float(np.median(a2))
    return Check(name, measured=f"{n} workers {min(a2):.1%}–{max(a2):.1%} (median {med:.1%}) against one process's "
                                f"{min(a1):.1%}–{max(a1):.1%}",
                 bound="the workers' median within one process's range or above it", held=held,
                 reason=f"their {n}-worker median, {med:.1%}, is below one process's range",
                 detail=if_held if held else if_not)


def long_check(long: dict, epochs: int, workers: int) -> Check:
    """Return whether `kit.bench mnist`'s seeds with more epochs (`long`: {epochs, 2_workers, 1_process}) caught
    up: the workers' median within one process's range or above it."""
    return _seeds_check(f"with {long['epochs'] // epochs}× the epochs ({long['epochs']}) the workers catch up",
                        long["2_workers"], long["1_process"], workers,
                        if_held=f"Trained on, the fewer, larger steps reach one process's accuracy, as Goyal et al. "
                                f"found; {epochs} epochs on these images stop short of that")


NO_SEEDS = ("One run of each cannot tell a difference of this size from run-to-run spread, and results/mnist.json "
            "holds no seeds for these images and epochs: `python -m kit.bench mnist` trains three of each.")
NO_LONG = "Whether more data or epochs close the gap is for `TRAIN_SAMPLES = None` or a larger `EPOCHS` to show."


def run_note(run: dict, spread: dict | None, checks: list[Check]) -> str:
    """Return the lesson's account of the notebook's `run` (run_checks' keys, dataset, seconds_n, seconds_1): the
    two accuracies and steps, the benchmark's seeds and control arm, and `checks` (run_checks) rendered."""
    n, e, acc_n, acc_1 = run["workers"], run["epochs"], run["acc_n"], run["acc_1"]
    head = (f"After {e} epochs on {run['n_train']:,} {run['dataset']} images: **{n} workers {acc_n:.1%}** test "
            f"accuracy ({run['steps_n']} steps of {n} × {BATCH} images per epoch, {run['seconds_n']:.0f} s), **one "
            f"process {acc_1:.1%}** ({run['steps_1']} steps of {BATCH} per epoch, {run['seconds_1']:.0f} s): a "
            f"difference of {100 * (acc_n - acc_1):+.1f} points. Same images seen, N times fewer steps with N times "
            "the batch and the learning rate. ")
    if not spread:
        return head + NO_SEEDS
    a2, a1 = spread["2_workers"], spread["1_process"]
    seeds = (f"`python -m kit.bench mnist` trained {len(a1)} seeds of each on the same images and epochs: {n} workers "
             f"{min(a2):.1%}–{max(a2):.1%}, one process {min(a1):.1%}–{max(a1):.1%}."
             + ("" if min(a1) <= acc_1 <= max(a1) else f" This run's one process ({acc_1:.1%}) fell outside that "
                f"range: {len(a1)} seeds show only part of the run-to-run spread."))
    longer = "" if all(c.held for c in checks) or spread.get("long") else f"\n\n{NO_LONG}"
    control = batch_control(spread)   # one process trained as the N workers are: the batch's gap, or not?
    return (head + seeds + "\n\n" + markdown(checks) + longer
            + (f"\n\nThe benchmark's control arm: {control}." if control else ""))
