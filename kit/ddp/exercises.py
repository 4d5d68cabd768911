"""Notebook 05's exercises graded without revealing the answer: each grader says correct, wrong (with what went
wrong, measured) or not answered yet, and no visible cell computes what it compares against.

    grade_buckets(my_calls)                    # exercise 1: allreduces per step of dp.Buckets at 600,000 B (DDP's rule)
    grade_zero2(my_held, my_sent)              # exercise 2: ZeRO-2's bytes held and sent per rank (N = 8)
    grade_hook(cluster, "MyBuckets")           # exercise 3: the learner's class, defined on the engines (%%px),
                                               # trains 3 steps; its weights against one process's SGD
    grade_zero(cluster, my_zero_step)          # exercise 4: the learner's ZeRO-1 step, run on every engine (judge_zero)

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


def _numel(state) -> int:
    """Elements of every tensor in `state` (dicts, lists and tuples walked)."""
    if isinstance(state, dict):
        return sum(_numel(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_numel(v) for v in state)
    return int(state.numel()) if hasattr(state, "numel") else 0


def zero_with(cfg: dict, fn, steps: int) -> dict:
    """On every engine: `steps` steps with the learner's `fn(opt)` as the optimizer's step; `opt` is a dp.ZeroSGD
    whose momentum is left to `fn` (opt.state starts empty). Report per shard of the padded flat parameters the
    largest |w - w_ref| against one process on the N× batch ("mean"; "sum": its lr × N; "no momentum") and against rank
    0's ("apart", rank 0's broadcast), the elements of opt.state's tensors, and the dist.all_reduce calls."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    rank, world = dist.get_rank(), dist.get_world_size()
    model = schemes.make_model(cfg)
    opt = dp.ZeroSGD(model.parameters(), cfg["lr"], cfg["momentum"])
    opt.momentum, opt.state = None, {}
    calls, real = [], dist.all_reduce
    dist.all_reduce = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    try:
        for step in range(steps):
            x, y = schemes.batch(cfg, step, rank, world)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            fn(opt)
    except NotImplementedError:
        return {"rank": rank, "unanswered": True}
    except Exception as e:          # the learner's code: report it, do not crash the grader
        return {"rank": rank, "error": f"{type(e).__name__}: {e}"}
    finally:
        dist.all_reduce = real

    def shards(m):
        return torch.cat([p.detach().reshape(-1) for p in m.parameters()]).split(opt.shard)
    mine = shards(model)
    theirs = torch.cat(mine)
    dist.broadcast(theirs, 0)                                        # rank 0's parameters, to compare with
    refs = {"mean": cfg, "sum": dict(cfg, lr=cfg["lr"] * world), "no momentum": dict(cfg, momentum=0.0)}
    errs = {k: [float((a - b).abs().max()) for a, b in zip(mine, shards(schemes.reference(c, world, steps)))]
            for k, c in refs.items()}
    apart = [float((a - b).abs().max()) for a, b in zip(mine, theirs.split(opt.shard))]
    return {"rank": rank, "errs": errs, "apart": apart, "state": _numel(opt.state),
            "shard": opt.shard, "allreduces": len(calls)}


def judge_zero(reports: list[dict], steps: int, tol: float = TOL) -> str:
    """Exercise 4's verdict from every rank's `zero_with` report (ordered by rank)."""
    if all(r.get("unanswered") for r in reports):
        return "exercise 4: not answered yet"
    for r in reports:
        if r.get("unanswered"):
            return f"exercise 4: rank {r['rank']} still raises NotImplementedError: every rank runs the same code"
        if "error" in r:
            return f"exercise 4: your step raised on rank {r['rank']}: {r['error']}"
    for r in reports[1:]:
        for s, apart in enumerate(r["apart"]):
            if apart > tol:
                return (f"exercise 4: wrong: the ranks disagree: rank {r['rank']}'s shard {s} of the parameters "
                        f"differs from rank 0's after {steps} steps; each rank updates its own shard, and every rank "
                        "needs every updated shard before the next forward (the all-gather)")
    worst = {k: max(max(r["errs"][k]) for r in reports) for k in reports[0]["errs"]}
    if worst["mean"] >= tol:
        if worst["sum"] < tol:
            return ("exercise 4: wrong: every update is N times one process's: the reduce-scatter leaves the sum of "
                    "the N gradients of your shard, the step wants their mean")
        if worst["no momentum"] < tol:
            return ("exercise 4: wrong: the parameters moved as SGD without momentum: your shard's momentum must "
                    "carry over from one step to the next (keep it in opt.state)")
        shard = max(range(len(reports[0]["apart"])), key=lambda s: max(r["errs"]["mean"][s] for r in reports))
        return (f"exercise 4: wrong: after {steps} steps the parameters differ from one process's SGD on the N× "
                f"batch by up to {worst['mean']:.1e} (allowed {tol:.0e}), most in shard {shard}")
    for r in reports:
        if r["state"] > r["shard"]:
            return (f"exercise 4: the parameters are right, but rank {r['rank']} keeps optimizer state for "
                    f"{r['state']:,} elements, {r['state'] / r['shard']:.1f}× its shard of {r['shard']:,}: keep "
                    "momentum for the shard this rank updates, and nothing more")
        if r["state"] == 0:
            return (f"exercise 4: the parameters are right, but rank {r['rank']} keeps no tensor in opt.state: keep "
                    "your shard's momentum there (where the grader, and a checkpoint, look for it)")
    called = [r["rank"] for r in reports if r["allreduces"]]
    if called:
        return (f"exercise 4: the parameters are right and the state sharded, but rank {called[0]} called "
                "dist.all_reduce: every rank received the whole summed gradient; ZeRO-1 reduce-scatters it, so that "
                "each rank receives its shard's sum only")
    return (f"exercise 4: correct: after {steps} steps every rank's parameters equal one process's SGD with momentum "
            f"on the N× batch and each rank's momentum covers its shard alone (|Δw| ≤ {worst['mean']:.1e})")


def grade_zero(cluster, fn, cfg: dict | None = None, steps: int = 3) -> str:
    """Exercise 4: train `steps` steps on every engine with `fn(opt)` as ZeRO-1's step and grade it."""
    if not callable(fn):
        raise TypeError(f"grade_zero: pass your function (my_zero_step), not {type(fn).__name__}")
    cfg = dict(schemes.CFG, **(cfg or {}))
    return judge_zero(cluster.wait(cluster.view.apply_async(zero_with, cfg, fn, steps)), steps)
