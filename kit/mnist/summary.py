"""Notebook 04's closing summary: what its run measured, one numbered line per section (the accuracy lesson, the
linear scaling rule, the replicas and the resume, the lab's allreduce).

    Markdown(mnist.summary.measured(run, spread, lesson, base, scaled, identical=True, resumed=(12, 12),
                                    lab=(slow, fast)))
"""
from __future__ import annotations

from kit.checks import Check


def measured(run: dict, spread: dict | None, lesson: list[Check], base: float, scaled: dict[int, float],
             identical: bool, resumed: tuple[int, int], lab: tuple[dict, dict]) -> str:
    """Return the numbered list of what the run measured: `run` and `lesson` (kit.mnist.accuracy.run_checks) against
    the seeds `spread`; `scaled` ({k: accuracy}) against `base`; replicas `identical`; the epoch `resumed` from (of
    how many); the allreduce's share of a step on 2 lab hosts at 1 and 10 Gbit/s (`lab`: those two runs)."""
    n, verdict = run["workers"], ""
    if spread:
        where = "within or above" if lesson[0].held else "below"
        verdict = f" ({where} one process's range over {len(spread['1_process'])} seeds)"
    batches = ", ".join(f"×{k} {acc:.1%}" for k, acc in scaled.items())
    slow, fast = lab
    return (f"1. {n} workers reached {run['acc_n']:.1%} test accuracy, one process {run['acc_1']:.1%}, after "
            f"{run['epochs']} epochs on the same {run['n_train']:,} {run['dataset']} images{verdict}.\n"
            f"2. Linear scaling (plain SGD, same samples): batch {batches}, against {base:.1%} at the base batch.\n"
            f"3. Replicas identical after training: {identical}; resumed from epoch {resumed[0]} of {resumed[1]}.\n"
            f"4. On 2 lab hosts the allreduce took {slow['allreduce_share']:.0%} of a step over 1 Gbit/s links and "
            f"{fast['allreduce_share']:.0%} over 10 Gbit/s" + _speedups(slow, fast))


def _speedups(slow: dict, fast: dict, gap: float = 0.10) -> str:
    """Return what the two rates did to the job's speed-up, when the runs carry their speed-ups: the tenfold link
    more than `gap` faster (kit.mnist.lab.claims' bound), within it, or slower."""
    if "speedup" not in slow or "speedup" not in fast:
        return "."
    a, b = slow["speedup"], fast["speedup"]
    said = f"; the speed-ups over one worker were {a:.2f}× and {b:.2f}×"
    if b > (1 + gap) * a:
        return said + ": the faster link paid."
    if b >= (1 - gap) * a:
        return said + (f", within {gap:.0%} of each other: the link's speed showed little in the step (the lab "
                       "section says how much of the slower link's allreduce hid behind the backward pass).")
    return said + ": the faster link's run was the slower one, which the link does not explain (the lab section)."
