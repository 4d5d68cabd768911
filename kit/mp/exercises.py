"""Notebook 06's exercises, graded here so that the notebook and its solutions call the same checks and no visible
cell computes an answer. Each says correct, wrong (with what went wrong) or not answered yet.

    check_tp(cluster, "Column", "Row")      # section 2: your column- and row-parallel layers (%%px-defined)
    check_schedule(my_afab, "afab", cluster)   # section 4: your AFAB (or "1f1b") order, played, then on the engines
    check_capped(capped, cluster, p=4)     # exercise 1: a 1F1B that never holds more than `cap` micro-batches,
                                           # on every (p, m, cap) of a grid, then on the engines
    check_gather(cluster, "GatherColumn")  # exercise 2: a column-parallel linear gathering its output (%%px-defined)
    check_micro_batches(my_m, p=8)         # exercise 3: the fewest micro-batches that keep the bubble <= 10%
"""
from __future__ import annotations

from functools import partial

from kit.mp import experiment, model, pipeline as pp

TP_SIZES = ({"d": 64, "hidden": 256, "batch": 32}, {"d": 30, "hidden": 77, "batch": 9})   # even; odd (77 = 20+19+19+19)


def engine_tp_answered(cfg: dict, column: str, row: str) -> str:
    """On every engine: "gap" while a gap of the classes `column`, `row` is still None, else "ran" or the error."""
    import torch
    from kit.mp import tensor
    try:
        tp = tensor.parallel_mlp(tensor.mlp(cfg["d"], cfg["hidden"]), experiment._engine_class(column, None),
                                 experiment._engine_class(row, None))
        if tp[0].weight is None or tp[2].weight is None:
            return "gap"
        x = torch.randn(cfg["batch"], cfg["d"], requires_grad=True)
        y = tp(x)
        if y is None:
            return "gap"
        y.sum().backward()
        return "gap" if x.grad is None else "ran"
    except TypeError as e:
        return "gap" if "NoneType" in str(e) else f"TypeError: {str(e).splitlines()[0]}"
    except (RuntimeError, ValueError, AttributeError, NameError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def check_tp(cluster, column: str = "Column", row: str = "Row") -> str:
    """Section 2: the %%px-defined classes `column`, `row` as Megatron's MLP block, on even and odd sizes, against
    the unsharded block (outputs and all gradients within 1e-5), with one allreduce forward and one backward."""
    for cfg in TP_SIZES:
        ran = set(cluster.wait(cluster.view.apply_async(engine_tp_answered, cfg, column, row)))
        if "gap" in ran:
            return "tensor parallelism: not answered yet"
        if ran != {"ran"}:
            return f"tensor parallelism: wrong (d={cfg['d']}, hidden={cfg['hidden']}: {sorted(ran - {'ran'})[0]})"
        r = experiment.tp_check(cluster, cfg={**cfg, "reps": 1}, column=column, row=row)
        where = f"d={cfg['d']}, hidden={cfg['hidden']}"
        for key, what in (("out", "the output"), ("dx", "the input's gradient"), ("grads", "the weights' gradients")):
            worst = max(d[key] for d in r["diff"])
            if not worst <= 1e-5:
                return f"tensor parallelism: wrong ({where}: {what} differs from the unsharded block's by {worst:.1e})"
        if r["allreduces"] != 2 or r["handed"] != r["model_handed"]:
            return (f"tensor parallelism: wrong ({where}: {r['allreduces']} allreduces handing {r['handed']:,} bytes "
                    f"in one forward + backward; the block needs 2 of batch x d floats)")
    return "tensor parallelism: correct"


def check_schedule(fn, name: str, cluster, p: int = 4) -> str:
    """Section 4: `fn(p, m, stage)`, the order of schedule `name` ("afab" or "1f1b"): every micro-batch's F then B
    once, played with fixed times to the formula's bubble and activations held, for p = 2..4 and m = 1, 3, 8; then
    its gradients on the cluster's `p` engines against one process."""
    label = name.upper()
    if fn(2, 2, 0) is None:
        return f"{label}: not answered yet"
    for ps in (2, 3, 4):
        for m in (1, 3, 8):
            where = f"p={ps}, m={m}"
            acts = [list(fn(ps, m, s)) for s in range(ps)]
            if any(sorted(a) != sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)]) for a in acts):
                return f"{label}: wrong ({where}: every stage needs one F and one B of each micro-batch)"
            if any(a.index(("F", i)) > a.index(("B", i)) for a in acts for i in range(m)):
                return f"{label}: wrong ({where}: a backward comes before its forward)"
            held = [pp.peak_held(a) for a in acts]
            if held != [model.peak_in_flight(name, ps, m, s) for s in range(ps)]:
                return f"{label}: wrong ({where}: the stages hold {held} micro-batches at most)"
            try:
                bubble = pp.bubble_of(pp.simulate(fn, ps, m))
            except ValueError:
                return f"{label}: wrong ({where}: the stages deadlock)"
            if abs(bubble - model.bubble(ps, m)) > 1e-9:
                return f"{label}: wrong ({where}: bubble {bubble:.3f}, not (p-1)/(m+p-1))"
    cluster.view.push({f"my_{name}": fn})
    if not experiment.grads_check(cluster, p=p, m=5, names=(f"my_{name}",))["ok"]:
        return f"{label}: wrong (the gradients on the engines differ from one process)"
    return f"{label}: correct"


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
