"""Notebook 00's exercises, graded here so that no visible cell computes an answer (the notebook and its solutions
call the same graders).

    grade_mean(cluster, my_mean)           # exercise 1: the ranks' mean with one allreduce, run on every engine
    grade_broadcast(cluster, sync_weights) # exercise 2: every rank's model starts from rank 0's weights
    check_square_sum(my_sum)               # exercise 3: the allreduced sum when every engine contributes (rank + 1)**2

A learner's function is shipped to the engines and run there; each engine reports what it saw (its input, the
function's result, which collectives it called); `judge_mean` / `judge_broadcast` read those reports and say what
is wrong without saying the answer. A skeleton that still raises NotImplementedError is "not answered yet".
"""
from __future__ import annotations

import math

ALLREDUCES = ("allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce")
BROADCASTS = ("broadcast", "broadcast_", "broadcast_async", "broadcast_async_")


def _counting(hvd, names: tuple[str, ...], calls: list[str]) -> dict:
    """Wrap `hvd`'s functions `names` so that each call is appended to `calls`; return the originals."""
    real = {n: getattr(hvd, n) for n in names if hasattr(hvd, n)}
    for n, f in real.items():
        setattr(hvd, n, (lambda f, n: lambda *a, **k: (calls.append(n), f(*a, **k))[1])(f, n))
    return real


def _run_mean(fn) -> dict:
    """On an engine: call the learner's `fn` on this rank's input, counting Horovod's allreduces."""
    import horovod.torch as hvd
    import torch

    x = torch.tensor([float(hvd.rank() + 1) ** 2, 3.0 - 2.0 * hvd.rank(), 0.5])
    calls: list[str] = []
    real = _counting(hvd, ALLREDUCES, calls)
    try:
        out = fn(x.clone())
        report = {"result": out.tolist() if isinstance(out, torch.Tensor) else None, "type": type(out).__name__}
    except NotImplementedError:
        report = {"unanswered": True}
    except Exception as e:                                   # the learner's error, reported with its rank
        report = {"error": f"{type(e).__name__}: {e}"}
    finally:
        for n, f in real.items():
            setattr(hvd, n, f)
    return {"rank": hvd.rank(), "input": x.tolist(), "calls": calls, **report}


def judge_mean(reports: list[dict], tol: float = 1e-5) -> str:
    """Exercise 1's verdict from every engine's report (ordered by rank)."""
    if all(r.get("unanswered") for r in reports):
        return "exercise 1: not answered yet"
    for r in reports:
        if r.get("unanswered"):
            return f"exercise 1: rank {r['rank']} still raises NotImplementedError: every rank runs the same code"
        if "error" in r:
            return f"exercise 1: rank {r['rank']} raised {r['error']}"
        if r["result"] is None:
            return (f"exercise 1: rank {r['rank']} returned a {r['type']}, not a tensor: return the tensor the "
                    "collective gives")
        if len(r["calls"]) != 1:
            return (f"exercise 1: rank {r['rank']} called Horovod's allreduce {len(r['calls'])} times; the exercise "
                    "asks for exactly one")
        if len(r["result"]) != len(r["input"]):
            return f"exercise 1: rank {r['rank']} returned {len(r['result'])} values for an input of {len(r['input'])}"
    n = len(reports)
    first = reports[0]["result"]
    for r in reports[1:]:
        if any(abs(a - b) > tol * max(1.0, abs(b)) for a, b in zip(r["result"], first)):
            return (f"exercise 1: rank {r['rank']}'s result differs from rank 0's: after an allreduce every rank "
                    "should hold the same values")
    sums = [sum(r["input"][i] for r in reports) for i in range(len(first))]
    if all(math.isclose(a, s, rel_tol=tol, abs_tol=tol) for a, s in zip(first, sums)) and n > 1:
        return "exercise 1: wrong: every rank got the sum over the ranks, not their mean"
    off = [i for i, (a, s) in enumerate(zip(first, sums)) if not math.isclose(a, s / n, rel_tol=tol, abs_tol=tol)]
    if off:
        bad = off[0]
        return f"exercise 1: wrong: element {bad} on every rank is not the mean of the ranks' inputs"
    return f"exercise 1: correct: one allreduce, the ranks' mean on all {n} ranks"


def grade_mean(cluster, fn) -> str:
    """Exercise 1: run `fn(t)` on every engine of `cluster`; it must return the mean of `t` over all ranks."""
    if not callable(fn):
        raise TypeError(f"grade_mean: pass your function (my_mean), not {type(fn).__name__}")
    return judge_mean(cluster.view.apply_sync(_run_mean, fn))


def _run_broadcast(fn) -> dict:
    """On an engine: build a model seeded by rank, call the learner's `fn(model)`, report its parameters."""
    import horovod.torch as hvd
    import torch

    torch.manual_seed(100 + hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    before = {k: v.flatten().tolist() for k, v in model.state_dict().items()}
    calls: list[str] = []
    real = _counting(hvd, BROADCASTS, calls)
    helper = hvd.broadcast_parameters

    def refused(*a, **k):
        raise RuntimeError("this exercise asks you to write broadcast_parameters yourself, from hvd.broadcast_")
    hvd.broadcast_parameters = refused
    try:
        fn(model)
        report = {"after": {k: v.flatten().tolist() for k, v in model.state_dict().items()}}
    except NotImplementedError:
        report = {"unanswered": True}
    except Exception as e:
        report = {"error": f"{type(e).__name__}: {e}"}
    finally:
        for n, f in real.items():
            setattr(hvd, n, f)
        hvd.broadcast_parameters = helper
    return {"rank": hvd.rank(), "before": before, "calls": calls, **report}


def judge_broadcast(reports: list[dict], tol: float = 1e-6) -> str:
    """Exercise 2's verdict from every engine's report (ordered by rank)."""
    if all(r.get("unanswered") for r in reports):
        return "exercise 2: not answered yet"
    for r in reports:
        if r.get("unanswered"):
            return f"exercise 2: rank {r['rank']} still raises NotImplementedError: every rank runs the same code"
        if "error" in r:
            return f"exercise 2: rank {r['rank']} raised {r['error']}"

    def same(a, b):
        return all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))
    root = reports[0]["before"]
    if not all(same(reports[0]["after"][k], root[k]) for k in root):
        moved = next(k for k in root if not same(reports[0]["after"][k], root[k]))
        return (f"exercise 2: wrong: rank 0's parameter '{moved}' changed; the root's values must stay as they were "
                "(a broadcast copies, it does not combine)")
    for r in reports[1:]:
        for k in root:
            if not same(r["after"][k], root[k]):
                return (f"exercise 2: wrong: rank {r['rank']}'s parameter '{k}' still differs from rank 0's: was "
                        "every parameter sent, in place, from root 0?")
    return f"exercise 2: correct: all {len(reports)} ranks hold rank 0's {len(root)} tensors"


def grade_broadcast(cluster, fn) -> str:
    """Exercise 2: run `fn(model)` on every engine; afterwards every rank's model must hold rank 0's parameters."""
    if not callable(fn):
        raise TypeError(f"grade_broadcast: pass your function (sync_weights), not {type(fn).__name__}")
    return judge_broadcast(cluster.view.apply_sync(_run_broadcast, fn))


def check_square_sum(answer, n: int = 4) -> str:
    """Exercise 3: the sum each of `n` engines gets when every engine contributes (rank + 1) ** 2."""
    if answer is None:
        return "exercise 3: not answered yet"
    return "exercise 3: correct" if answer == sum((r + 1) ** 2 for r in range(n)) else "exercise 3: wrong"
