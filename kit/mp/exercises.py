"""Notebook 06's exercises, graded here so that the notebook and its solutions call the same checks and no visible
cell computes an answer. Each says correct, wrong (with what went wrong) or not answered yet.

    check_capped(capped, cluster, p=4)     # exercise 1: a 1F1B that never holds more than `cap` micro-batches,
                                           # on every (p, m, cap) of a grid, then on the engines
    check_gather(cluster, "GatherColumn")  # exercise 2: a column-parallel linear gathering its output (%%px-defined)
    check_micro_batches(my_m, p=8)         # exercise 3: the fewest micro-batches that keep the bubble <= 10%
"""
from __future__ import annotations

from functools import partial

from kit.mp import experiment, model, pipeline as pp


def check_capped(fn, cluster, p: int = 4) -> str:
    """Exercise 1: `fn(p, m, stage, cap)`, a schedule holding at most `cap` micro-batches per stage: every
    micro-batch's F and B once, no deadlock, no longer a step than the kit's capped schedule; then its gradients on
    the cluster's `p` engines (cap = 2) against one process."""
    if fn(2, 2, 0, 2) is None:
        return "exercise 1: not answered yet"
    for ps in (2, 3, 4):
        for m in (1, 3, 6):
            for cap in range(1, ps + 2):
                where = f"p={ps}, m={m}, cap={cap}"
                acts = [fn(ps, m, s, cap) for s in range(ps)]
                if any(sorted(a) != sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)]) for a in acts):
                    return f"exercise 1: wrong ({where}: every micro-batch needs one F and one B)"
                if any(pp.peak_held(a) > cap for a in acts):
                    return f"exercise 1: wrong ({where}: a stage holds more than cap)"
                try:
                    mine = pp.bubble_of(pp.simulate(partial(fn, cap=cap), ps, m))
                except ValueError:
                    return f"exercise 1: wrong ({where}: the stages deadlock)"
                if mine > pp.bubble_of(pp.simulate(partial(pp.capped, cap=cap), ps, m)) + 1e-9:
                    return f"exercise 1: wrong ({where}: a longer step than needed)"
    cluster.view.push({"capped_2": partial(fn, cap=2)})
    if not experiment.grads_check(cluster, p=p, m=5, names=("capped_2",))["ok"]:
        return "exercise 1: wrong (the gradients on the engines differ from one process)"
    return "exercise 1: correct"


def check_gather(cluster, name: str = "GatherColumn") -> str:
    """Exercise 2: the class `name` defined on every engine, against the unsharded nn.Linear (output and both
    gradients within 1e-5)."""
    r = experiment.gather_check(cluster, name)
    if not r["answered"]:
        return "exercise 2: not answered yet"
    return "exercise 2: correct" if r["ok"] else f"exercise 2: wrong ({r['why']})"


def check_micro_batches(answer, p: int = 8, share: float = 0.1) -> str:
    """Exercise 3: the fewest micro-batches m with the bubble (p-1)/(m+p-1) at most `share` of the step."""
    if answer is None:
        return "exercise 3: not answered yet"
    right = model.bubble(p, answer) <= share and (answer == 1 or model.bubble(p, answer - 1) > share)
    return "exercise 3: correct" if right else "exercise 3: wrong (write the formula as an inequality in m)"
