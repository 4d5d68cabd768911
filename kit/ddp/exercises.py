"""Notebook 05's exercises graded without revealing the answer: each grader says correct, wrong (with what went
wrong, measured) or not answered yet, and no visible cell computes what it compares against.

    grade_buckets(my_calls)                    # exercise 1: allreduces per step of dp.Buckets at 600,000 B (DDP's rule)
    grade_zero2(my_held, my_sent)              # exercise 2: ZeRO-2's bytes held and sent per rank (N = 8)
    grade_hook(cluster, "MyBuckets")           # exercise 3: the learner's class, defined on the engines (%%px),
                                               # trains 3 steps; its weights against one process's SGD

The learner's class has dp.Buckets' interface: `cls(model)` registers its hooks and sets `buckets` (lists of
parameter indices), `finish()` runs between backward and the optimizer's step, `remove()` takes the hooks off
(optional). The grader wants one process's weights, every allreduce launched asynchronously, and one allreduce per
bucket.
"""
from __future__ import annotations

import hashlib

from kit.comm import dp
from kit.ddp import schemes

TOL = 1e-5            # |Δw| of float32 sums in another order
WRITE = ("_ready", "_launch", "finish")      # exercise 3: the methods of dp.Buckets the learner writes


def grade_buckets(answer, bucket_bytes: int = 600_000) -> str:
    """Exercise 1: the number of allreduces dp.Buckets makes per step for notebook 05's model at `bucket_bytes`."""
    if answer is None:
        return "exercise 1: not answered yet"
    sizes = [p.numel() * p.element_size() for p in schemes.make_model(schemes.CFG).parameters()]
    if answer == len(dp.assign_buckets(sizes, bucket_bytes)):
        return "exercise 1: correct"
    return ("exercise 1: wrong (walk the sizes from the last one; a bucket closes once it reaches its cap, and with a "
            "cap given, the first bucket has it too)")


def grade_zero2(held, sent, N: int = 8, params: int = 100 * 2**20) -> str:
    """Exercise 2: the bytes one rank holds (parameters, gradients, momentum) under ZeRO-2 with SGD and momentum on
    N ranks, and the bytes it sends per step (a reduce-scatter and an all-gather of K, by the ring). The held answer
    is compared by its hash, so this source does not give it away."""
    if held is None or sent is None:
        return "exercise 2: not answered yet"
    K = 4 * params                                      # bytes of float32
    right_held = hashlib.sha256(str(held).encode()).hexdigest()[:16] == "7c1acb7d57185101"
    right_sent = sent == dp.sent_per_step([("reduce_scatter_single", K), ("all_gather_single", K)], N)
    return ("exercise 2: correct" if right_held and right_sent else
            f"exercise 2: held {'right' if right_held else 'wrong'}, sent {'right' if right_sent else 'wrong'}")


def _engine_class(name: str):
    """The class called `name` in this engine's namespace (what a %%px cell defined)."""
    from IPython import get_ipython
    ns = get_ipython().user_ns
    if name not in ns:
        raise NameError(f"no {name!r} on this engine: run the %%px cell that defines it first")
    return ns[name]


def _borrowed(cls, method: str) -> bool:
    """Whether `cls` leaves `method` to dp.Buckets: not overridden, or overridden by a method that calls super() or
    dp.Buckets' own of that name (read from its bytecode's names: `return super()._ready(p)` is borrowed,
    `super()._reset()` inside a written finish() is not)."""
    mine = getattr(cls, method, None)
    if mine is getattr(dp.Buckets, method):
        return True
    names = getattr(getattr(mine, "__code__", None), "co_names", ())
    return method in names and ("super" in names or "Buckets" in names)    # super()._reset() is the learner's own


def train_with(cfg: dict, name: str, steps: int, cls=None) -> dict:
    """On every engine: `steps` steps of SGD with the class `name` (or `cls`) syncing the gradients; return
    {"err": largest |Δw| against one process on the N× batch, "calls": collectives per step, "async": whether every
    allreduce was launched with async_op=True, "buckets": len(its buckets) or None, "error": what it raised or None}."""
    import torch.distributed as dist
    import torch.nn.functional as F
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        cls = cls or _engine_class(name)
        kept = [m for m in WRITE if cls is not dp.Buckets and _borrowed(cls, m)]
        if kept:
            return {"err": None, "calls": 0, "async": False, "buckets": None, "error": None, "kept": kept}
        model = schemes.make_model(cfg)
        opt, sync = schemes.sgd(model.parameters(), cfg), cls(model)
        launched = []
        real = dist.all_reduce

        def spy(*args, **kwargs):
            launched.append(bool(kwargs.get("async_op", False)))
            return real(*args, **kwargs)
        dist.all_reduce = spy
        try:
            for step in range(steps):
                x, y = schemes.batch(cfg, step, rank, world)
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                sync.finish()
                opt.step()
        finally:
            dist.all_reduce = real
            if hasattr(sync, "remove"):
                sync.remove()
        return {"err": schemes.max_diff(model, schemes.reference(cfg, world, steps)), "calls": len(launched) // steps,
                "async": bool(launched) and all(launched), "error": None,
                "buckets": len(sync.buckets) if hasattr(sync, "buckets") else None}
    except Exception as e:          # the learner's code: report it, do not crash the grader
        return {"err": None, "calls": 0, "async": False, "buckets": None, "error": f"{type(e).__name__}: {e}"}


def verdict(results: list[dict], steps: int) -> str:
    """Exercise 3's sentence from every rank's `train_with` result."""
    if results[0].get("kept"):
        return (f"exercise 3: not answered yet: your class still uses dp.Buckets' own "
                f"{', '.join(results[0]['kept'])}; write them")
    errors = [(r, x["error"]) for r, x in enumerate(results) if x["error"]]
    if errors:
        r, e = errors[0]
        return f"exercise 3: your class raised on rank {r}: {e}"
    if all(x["calls"] == 0 for x in results):
        return "exercise 3: not answered yet (your hooks launched no allreduce)"
    err = max(x["err"] for x in results)
    if err >= TOL:
        return (f"exercise 3: wrong: after {steps} steps the weights differ from one process on the N× batch by up "
                f"to {err:.1e} (allowed {TOL:.0e})")
    if not all(x["async"] for x in results):
        return ("exercise 3: the weights are right, but not every allreduce was launched asynchronously: backward "
                "waited for them, nothing overlapped")
    calls, buckets = results[0]["calls"], results[0].get("buckets")
    if buckets is not None and calls != buckets:
        return (f"exercise 3: the weights are right, but {calls} allreduces per step for {buckets} buckets: a "
                "bucket's gradients go in one flat message")
    return (f"exercise 3: correct: every rank's weights equal one process on the N× batch after {steps} steps "
            f"(|Δw| ≤ {err:.1e}), {calls} async allreduces per step" + (", one per bucket" if buckets else ""))


def grade_hook(cluster, name: str = "MyBuckets", cfg: dict | None = None, steps: int = 3) -> str:
    """Exercise 3: train with the learner's class `name` (defined on every engine) and grade it."""
    cfg = dict(schemes.CFG, **(cfg or {}))
    return verdict(cluster.wait(cluster.view.apply_async(train_with, cfg, name, steps)), steps)
