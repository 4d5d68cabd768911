"""Pipeline parallelism by hand: stages over send/recv, the AFAB (GPipe) and 1F1B schedules, a timeline and the
activations each stage holds.

    acts = one_f_one_b(p, m, stage)            # [("F", 0), ("F", 1), ("B", 0), ...]: this stage's order
    out = run_step(stage_module, acts, stage=s, p=p, xs=..., ys=...)   # one step on every rank; returns its events

A schedule is a list of actions per stage; `simulate` plays them with fixed forward/backward times (no processes),
`run_step` plays them for real, activations forward with send/recv and their gradients back.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist


def _check(p: int, m: int, stage: int):
    if not isinstance(p, int) or p < 1 or not isinstance(m, int) or m < 1:
        raise ValueError(f"p (stages) and m (micro-batches) must be whole numbers >= 1, got p={p!r}, m={m!r}")
    if not 0 <= stage < p:
        raise ValueError(f"stage must be in 0..{p - 1} for p={p} stages, got {stage!r}")


def afab(p: int, m: int, stage: int) -> list[tuple[str, int]]:
    """Return GPipe's order for `stage`: all m forwards, then all m backwards."""
    _check(p, m, stage)
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def one_f_one_b(p: int, m: int, stage: int) -> list[tuple[str, int]]:
    """Return 1F1B's order for `stage`: p-1-stage warm-up forwards, then one forward one backward, then the rest."""
    _check(p, m, stage)
    warm = min(p - 1 - stage, m)
    acts = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        acts += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    return acts + [("B", i) for i in range(b, m)]


def capped(p: int, m: int, stage: int, cap: int) -> list[tuple[str, int]]:
    """Return 1F1B with at most `cap` micro-batches held on any stage (cap < p: fewer warm-up forwards)."""
    _check(p, m, stage)
    warm = max(0, min(p - 1 - stage, cap - 1, m))
    acts, f, b = [("F", i) for i in range(warm)], warm, 0
    while f < m:
        acts += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    return acts + [("B", i) for i in range(b, m)]


SCHEDULES = {"afab": afab, "1f1b": one_f_one_b}


def schedule(name: str):
    """Return the schedule function called `name` ("afab" or "1f1b")."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {name!r}")
    return SCHEDULES[name]


def simulate(acts_of, p: int, m: int, tf: float = 1.0, tb: float = 2.0, link: float = 0.0) -> list[dict]:
    """Play schedule `acts_of(p, m, stage)` with forward tf and backward tb; return events. `link`: the time an
    activation (or its gradient) takes from one stage to the next (0: communication is free).

    F(s, i) waits for F(s-1, i); B(s, i) waits for B(s+1, i); each stage runs its actions in its order. Raises
    ValueError when the orders deadlock (a stage waits for something that never comes)."""
    orders = [list(acts_of(p, m, s)) for s in range(p)]
    done, free, nxt, events = {}, [0.0] * p, [0] * p, []
    while any(nxt[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if nxt[s] >= len(orders[s]):
                continue
            kind, i = orders[s][nxt[s]]
            dep = (("F", s - 1, i) if s > 0 else None) if kind == "F" else \
                (("B", s + 1, i) if s < p - 1 else ("F", s, i))
            if dep is not None and dep not in done:
                continue
            start = max(free[s], done[dep] + (link if dep[1] != s else 0.0) if dep else 0.0)
            end = start + (tf if kind == "F" else tb)
            done[(kind, s, i)], free[s], nxt[s] = end, end, nxt[s] + 1
            events.append({"stage": s, "kind": kind, "mb": i, "t0": start, "t1": end})
            progressed = True
        if not progressed:
            raise ValueError(f"the schedule deadlocks: stages wait at {[orders[s][nxt[s]] for s in range(p)]}")
    return events


def bubble_of(events: list[dict]) -> float:
    """Return the idle share of a step from its events: 1 - (mean busy time per stage) / (first start to last end)."""
    stages = sorted({e["stage"] for e in events})
    span = max(e["t1"] for e in events) - min(e["t0"] for e in events)
    busy = sum(e["t1"] - e["t0"] for e in events) / len(stages)
    return 1 - busy / span


def peak_held(acts: list[tuple[str, int]]) -> int:
    """Return the most micro-batches whose activations are held at once (forward done, backward not yet)."""
    held = peak = 0
    for kind, _ in acts:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


class Work(torch.autograd.Function):
    """Stand-in compute: sleep tf in forward and tb in backward (a bigger stage's time on a shared CPU)."""

    @staticmethod
    def forward(ctx, x, tf, tb):
        ctx.tb = tb
        time.sleep(tf)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.tb)
        return grad, None, None


class Delay(torch.nn.Module):
    """A layer that only takes time: tf seconds in forward, tb in backward."""

    def __init__(self, tf: float = 0.0, tb: float = 0.0):
        super().__init__()
        self.tf, self.tb = tf, tb

    def forward(self, x):
        return Work.apply(x, self.tf, self.tb) if (self.tf or self.tb) else x


def make_model(p: int, d: int = 32, seed: int = 0, tf: float = 0.0, tb: float = 0.0) -> torch.nn.Sequential:
    """Return the whole model: p blocks (Linear(d, d), GELU, Linear(d, d), Delay), one per stage, seeded."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, d),
                                                     Delay(tf, tb)) for _ in range(p)])


def data(batch: int, d: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Return one step's inputs and targets (batch x d each), seeded."""
    gen = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(batch, d, generator=gen), torch.randn(batch, d, generator=gen)


def loss_fn(out, target):
    """The loss of one micro-batch: mean squared error."""
    return torch.nn.functional.mse_loss(out, target)


def run_step(module, acts, *, stage: int, p: int, xs=None, ys=None, shape=None, ranks=None, clock=time.perf_counter):
    """Run one step of `acts` for this stage: receive, compute, send; return events, loss, activations held.

    An event spans what the stage does for one action, from the moment its input is there (after the recv) to the
    moment it has handed its output on (isend posted): its busy time. The rest is the stage waiting for a
    neighbour, the idle time the bubble formula is about.

    xs: the first stage's micro-batch inputs; ys: the last stage's targets; shape: a micro-batch's activation
    shape (what the others receive); ranks: the global rank of each stage (default 0..p-1). Each micro-batch's
    loss is divided by m, so the gradients are those of the mean over the whole batch.

    peak_bytes: the most bytes autograd kept alive on this stage at once (kit.mp.memory.Saved: each tensor once,
    parameters excluded); mb_bytes: what one micro-batch's forward left alive; peak: the most micro-batches
    between their forward and their backward (the schedule's count)."""
    from kit.mp.memory import Saved
    ranks = list(range(p)) if ranks is None else ranks
    m = sum(1 for k, _ in acts if k == "F")
    prev, nxt = (ranks[stage - 1] if stage > 0 else None), (ranks[stage + 1] if stage < p - 1 else None)
    saved, sends, events, loss = {}, [], [], 0.0
    held = peak = 0
    mem = Saved(module.parameters())            # the bytes autograd keeps alive on this stage, parameters excluded
    one = None                                  # what one micro-batch's forward left alive (the first one's)
    for kind, i in acts:
        if kind == "F":
            if prev is None:
                x = xs[i]
            else:
                x = torch.empty(shape)
                dist.recv(x, prev)                      # the previous stage's activations of micro-batch i
                x.requires_grad_(True)
            before = mem.live
            t0 = clock()
            with mem:
                y = module(x)
                if nxt is None:
                    y = loss_fn(y, ys[i]) / m
            if nxt is None:
                loss += float(y.detach())
            else:
                sends.append(dist.isend(y.detach(), nxt))
            t1 = clock()                                # computed and handed on: the stage is free again
            one = mem.live - before if one is None else one
            saved[i] = (x, y)
            held += 1
            peak = max(peak, held)
        else:
            x, y = saved.pop(i)
            grad = None
            if nxt is not None:
                grad = torch.empty_like(y)
                dist.recv(grad, nxt)                    # the next stage's gradient of my output
            t0 = clock()
            y.backward(grad)
            if prev is not None:
                sends.append(dist.isend(x.grad, prev))
            t1 = clock()
            held -= 1
            del x, y
        events.append({"stage": stage, "kind": kind, "mb": i, "t0": t0, "t1": t1})
    for w in sends:
        w.wait()
    return {"events": events, "loss": loss, "peak": peak, "peak_bytes": mem.peak, "mb_bytes": one or 0}
