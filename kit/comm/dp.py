"""Data parallelism by hand (notebook 05): gradient allreduce in hooks, naive, overlapped and bucketed; a ZeRO-style
sharded step; the bytes each scheme hands to its collectives, counted, and what the ring cost model says they cost.

    handles = naive_allreduce_hooks(model)          # each gradient summed (and averaged) the moment it is ready
    sync = Overlap(model);  ...backward()...;  sync.finish();  opt.step()      # async, wait before the step
    sync = Buckets(model, bucket_bytes=1 << 20)     # the same, one flat allreduce per bucket (as DDP does)
    opt = ZeroSGD(model.parameters(), lr, momentum) # reduce-scatter, update the own shard, all-gather (ZeRO-1)
    with counting() as calls: ...                   # every collective call and the bytes it was handed
    with PeakMeter(model, opt) as peak: ...         # the most state bytes this rank held at once during a step

Each class is a few dozen lines on torch.distributed (any backend; the notebook uses Gloo on the CPU). DDP's design
is Li et al., "PyTorch Distributed" (VLDB 2020); ZeRO is Rajbhandari et al. (SC 2020). The hooks assume one backward
pass per optimizer step (no gradient accumulation) and the same model, in the same order, on every rank.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import sys

from kit.comm.costmodel import ring_bytes, t_comm_ring


# ----------------------------------------------------------------------------- naive: one allreduce per gradient
def naive_allreduce_hooks(model) -> list:
    """Sum every gradient over the ranks as soon as backward has produced it, then divide by N; return the hook
    handles (`h.remove()` undoes it). Synchronous: backward waits for each allreduce before going on."""
    import torch.distributed as dist
    world = dist.get_world_size()

    def hook(p):
        dist.all_reduce(p.grad)             # DP: add the other ranks' gradient of this parameter, now
        p.grad /= world                     # DP: the mean over N ranks = the gradient of the N× batch's mean loss
    return [p.register_post_accumulate_grad_hook(hook) for p in model.parameters() if p.requires_grad]


# ----------------------------------------------------------------------------- overlap: launch now, wait later
class Overlap:
    """Launch each gradient's allreduce asynchronously from its hook, so it travels while backward computes the
    gradients of earlier layers; `finish()` waits for all of them (and averages) and MUST run before opt.step():
    until then a gradient may be half summed."""

    def __init__(self, model):
        import torch.distributed as dist
        self.world, self.pending = dist.get_world_size(), []
        self.handles = [p.register_post_accumulate_grad_hook(self._launch)
                        for p in model.parameters() if p.requires_grad]

    def _launch(self, p):
        import torch.distributed as dist
        self.pending.append((p, dist.all_reduce(p.grad, async_op=True)))   # DP: returns at once, a Work

    def finish(self):
        """Wait for every allreduce launched since the last call, then divide the sums by N."""
        for p, work in self.pending:
            work.wait()
            p.grad /= self.world
        self.pending.clear()

    def remove(self):
        for h in self.handles:
            h.remove()


# ----------------------------------------------------------------------------- buckets: fewer, larger messages
FIRST_BUCKET_BYTES = 1 << 20     # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: DDP's small first bucket (1 MiB)
DEFAULT_BUCKET_BYTES = 25 << 20  # DDP's default cap (bucket_cap_mb=None: 25 MiB)


def assign_buckets(nbytes: list[int], bucket_bytes: int | None = None,
                   first_bucket_bytes: int | None = None) -> list[list[int]]:
    """Group parameter indices, last first, into buckets as DDP rebuilds them: one closes once it *reaches* its cap;
    None is DDP's default cap (25 MiB, the first bucket 1 MiB); a cap given caps the first too (torch's rule)."""
    cap = DEFAULT_BUCKET_BYTES if bucket_bytes is None else bucket_bytes
    first = (FIRST_BUCKET_BYTES if bucket_bytes is None else cap) if first_bucket_bytes is None else first_bucket_bytes
    buckets, current, size = [], [], 0
    for i in reversed(range(len(nbytes))):
        current.append(i)
        size += nbytes[i]
        if size >= (cap if buckets else first):
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


class Buckets:
    """Like Overlap, but gradients are grouped into buckets (`assign_buckets`: DDP's rule); when every gradient of a
    bucket is ready, they are copied into one flat buffer and summed by ONE async allreduce: fewer messages, so less
    of the per-message latency α. Buckets are launched in order (every rank must call its collectives in one order)."""

    def __init__(self, model, bucket_bytes: int | None = None, first_bucket_bytes: int | None = None):
        import torch.distributed as dist
        self.world, self.params = dist.get_world_size(), [p for p in model.parameters() if p.requires_grad]
        self.buckets = assign_buckets([p.numel() * p.element_size() for p in self.params], bucket_bytes,
                                      first_bucket_bytes)
        self.bucket_of = {id(self.params[i]): b for b, ids in enumerate(self.buckets) for i in ids}
        self.handles = [p.register_post_accumulate_grad_hook(self._ready) for p in self.params]
        self._reset()

    def _reset(self):
        self.missing = [len(ids) for ids in self.buckets]   # gradients each bucket still waits for
        self.next, self.pending = 0, []                      # the next bucket to launch; (bucket, flat, work)

    def _ready(self, p):
        self.missing[self.bucket_of[id(p)]] -= 1
        while self.next < len(self.buckets) and self.missing[self.next] == 0:
            self._launch(self.next)

    def _launch(self, b):
        import torch
        import torch.distributed as dist
        grads = [self._grad(self.params[i]) for i in self.buckets[b]]
        flat = torch.cat([g.reshape(-1) for g in grads])              # one message for the whole bucket
        work = dist.all_reduce(flat, async_op=True) if flat.numel() else None   # DP: launched, not waited for
        self.pending.append((b, flat, work))
        self.next += 1

    @staticmethod
    def _grad(p):
        if p.grad is None:                        # a parameter backward did not reach: a zero gradient
            import torch
            p.grad = torch.zeros_like(p)
        return p.grad

    def finish(self):
        """Launch any bucket still waiting (unused parameters), wait for all, copy the means back into .grad."""
        while self.next < len(self.buckets):
            self._launch(self.next)
        for b, flat, work in self.pending:
            if work is not None:
                work.wait()
            flat /= self.world
            grads = [self.params[i].grad for i in self.buckets[b]]
            for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(piece.view_as(g))
        self._reset()

    def temporaries(self):
        """The flat buffers alive now (launched, not yet finished): what PeakMeter counts as temporary."""
        return [flat for _, flat, _ in self.pending]

    def remove(self):
        for h in self.handles:
            h.remove()


# ----------------------------------------------------------------------------- ZeRO: shard the optimizer's work
_RECORDING: list | None = None        # counting()'s list while it is active: the ring's phases add to it


def _record(name: str, full_bytes: int):
    if _RECORDING is not None:
        _RECORDING.append((name, full_bytes))


class ZeroSGD:
    """SGD with momentum, ZeRO-1 (the optimizer state sharded), on the two phases of notebook 03's ring
    (kit.comm.ring): scatter-reduce the flat gradient (padded to a multiple of N), after which rank r holds the
    summed chunk (r + 1) % N; keep momentum for that shard alone and update that shard of the parameters; allgather
    the shards into every rank's full copy. The parameters and their gradients live in two flat buffers from the
    start (each parameter and each `.grad` a view into them, as DeepSpeed keeps them), so both ring phases run in
    place: per rank the full parameters, the full gradient, 1/N of the optimizer state, ZeRO-1's (2 + 1/N)·K, plus
    the ring's two receive buffers during the step (a piece each, or a chunk if smaller). ZeRO-2 would reduce-scatter
    bucket by bucket during backward and keep only its 1/N of the gradient. `step()` and `zero_grad()` zero the
    gradient buffer in place (never freed). On the wire, (N-1)/N·K per phase: an allreduce's bytes. (Gloo's
    reduce-scatter is an allreduce with the rest thrown away, twice the bytes: pytorch/pytorch#118911.)"""
    PIECE_BYTES = 4 * 2**20        # the ring's pieces: scatter-reduce receives into two buffers of this size

    def __init__(self, params, lr: float, momentum: float = 0.0, piece_bytes: int = PIECE_BYTES):
        import torch
        import torch.distributed as dist
        from kit.comm.link import Link
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.mu = lr, momentum
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.shard = math.ceil(self.numel / self.world)                  # elements this rank owns
        self.lo = (self.rank + 1) % self.world * self.shard              # ... the chunk the ring leaves it with
        dtype = self.params[0].dtype
        self.flat_param = torch.zeros(self.shard * self.world, dtype=dtype)   # padded: N equal shards
        self.flat_grad = torch.zeros_like(self.flat_param)
        with torch.no_grad():
            for p, view, grad in zip(self.params, self._views(self.flat_param), self._views(self.flat_grad)):
                view.copy_(p)
                p.data = view                                            # the parameter now lives in the buffer
                p.grad = grad                                            # backward accumulates into the buffer
        self.momentum = torch.zeros(self.shard, dtype=dtype)
        self.state = {"shard": {"momentum_buffer": self.momentum}}       # what torch's optimizers call state
        self.link, self.piece = Link(f"rank {self.rank}"), max(1, piece_bytes // self.momentum.element_size())
        self.meter = None                                                # a PeakMeter sees the step's buffers

    def _views(self, flat):
        """Each parameter's view of `flat`, in order, shaped like the parameter."""
        return [piece.view_as(p) for p, piece in
                zip(self.params, flat[:self.numel].split([p.numel() for p in self.params]))]

    def zero_grad(self):
        self.flat_grad.zero_()
        for p, grad in zip(self.params, self._views(self.flat_grad)):
            if p.grad is None or p.grad.data_ptr() != grad.data_ptr():
                p.grad = grad                                            # set to None or replaced elsewhere

    def step(self):
        from kit.comm.ring import allgather, make_scratch, scatter_reduce
        mine = slice(self.lo, self.lo + self.shard)
        scratch = make_scratch(self.flat_grad, self.world, self.piece) if self.world > 1 else []
        if self.meter:
            self.meter.probe(*scratch)                    # the full gradient and the ring's two receive buffers
        if self.world > 1:
            scatter_reduce(self.flat_grad, self.rank, self.world, self.link, self.piece, scratch)  # phase 1: my shard
        _record("reduce_scatter", self.flat_grad.numel() * self.flat_grad.element_size())
        grad = self.flat_grad[mine].div_(self.world)                     # the mean over N ranks, in place
        self.momentum.mul_(self.mu).add_(grad)                           # torch.optim.SGD's momentum rule
        self.flat_param[mine].add_(self.momentum, alpha=-self.lr)        # update my shard only
        if self.world > 1:
            allgather(self.flat_param, self.rank, self.world, self.link, self.piece)  # ZeRO: phase 2, all shards
        _record("all_gather", self.flat_param.numel() * self.flat_param.element_size())
        if self.meter:
            self.meter.probe()
        self.flat_grad.zero_()             # the reduce-scatter left partial sums there: not a gradient to keep


# ----------------------------------------------------------------------------- what each rank holds and sends
def nbytes(tensors) -> int:
    """Bytes of the tensors this rank holds (a sharded DTensor counts its local shard only; None counts 0)."""
    total = 0
    for t in tensors:
        if t is not None:
            local = t.to_local() if hasattr(t, "to_local") else t
            total += local.numel() * local.element_size()
    return total


def held_bytes(model, optimizer) -> dict:
    """Return the bytes this rank holds of parameters (the model's, or a list of them), gradients (.grad) and optimizer
    state (every tensor in optimizer.state), measured from the tensors themselves (a view counts its own elements)."""
    import torch
    params = list(model.parameters() if hasattr(model, "parameters") else model)
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    return {"params": nbytes(params), "grads": nbytes([p.grad for p in params]), "optimizer": nbytes(state)}


class PeakMeter:
    """Within `with PeakMeter(model, opt) as peak:` (one step), measure what this rank holds before each module's
    forward, after each gradient lands, at the optimizer's probes (ZeroSGD) and at the end; keep the largest total:
    `peak.peak` = {params, grads, optimizer, temporary, total}. params and grads: the parameters the model had when
    the step began (FSDP2's shards) and their .grad; temporary: what else is alive then: parameters swapped in since
    (FSDP2's unsharded layers) and their .grad, `temporaries()` (a scheme's flat buffers), the optimizer's probes.
    Not counted: activations, buffers inside C++ (DDP's buckets unless its grads are views of them, as in
    kit.ddp.setup; Horovod's fusion buffer; the fp16 hook's copies)."""

    def __init__(self, model, optimizer, temporaries=None):
        self.model, self.opt, self.peak, self.extra = model, optimizer, {"total": -1}, temporaries or (lambda: [])

    def __enter__(self):
        self.params = list(self.model.parameters())
        self.ids, self.hooked = {id(p) for p in self.params}, set()
        owners = [m for m in self.model.modules() if next(m.parameters(recurse=False), None) is not None]
        self.handles = [p.register_post_accumulate_grad_hook(lambda p: self.probe())
                        for p in self.params if p.requires_grad]
        self.handles += [m.register_forward_pre_hook(self._before_forward) for m in owners]
        if hasattr(self.opt, "meter"):
            self.opt.meter = self
        self.probe()
        return self

    def _before_forward(self, module, args):
        """Measure; hook the parameters swapped in (FSDP2's unsharded ones), to measure again when their grads land."""
        for p in module.parameters(recurse=False):
            if id(p) not in self.ids | self.hooked and p.requires_grad:
                self.hooked.add(id(p))
                self.handles.append(p.register_post_accumulate_grad_hook(lambda p: self.probe()))
        self.probe()

    def probe(self, *temporary):
        """Measure now; `temporary`: tensors alive now that the model and the optimizer do not hold."""
        swapped = [p for p in self.model.parameters() if id(p) not in self.ids]
        now = {**held_bytes(self.params, self.opt),
               "temporary": nbytes([*swapped, *(p.grad for p in swapped), *self.extra(), *temporary])}
        now["total"] = sum(now.values())
        if now["total"] > self.peak["total"]:
            self.peak = now

    def __exit__(self, *exc):
        self.probe()
        for h in self.handles:
            h.remove()
        if hasattr(self.opt, "meter"):
            self.opt.meter = None
        return False


COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "reduce_scatter_single", "all_gather_into_tensor",
               "all_gather_single")


@contextlib.contextmanager
def counting():
    """Record every collective called through `torch.distributed.<name>` while inside: a list of
    (name, bytes of the full tensor: the allreduced one, the reduce-scatter's input, the all-gather's output).
    It wraps the module's functions (and Horovod's `allreduce_async_`, which DistributedOptimizer calls once per
    gradient) for the duration (calls made inside torch's C++, like DDP's own default
    allreduce, are not seen: give DDP a Python comm hook to count it); ZeroSGD's ring phases record themselves as
    "reduce_scatter" and "all_gather"."""
    import torch.distributed as dist
    calls, saved = [], {n: getattr(dist, n) for n in COLLECTIVES if hasattr(dist, n)}

    def wrap(name, fn):
        which = 1 if name.startswith("reduce_scatter") else 0         # (output, input): the input is the full one
        signature = inspect.signature(fn)

        def counted(*args, **kwargs):
            full = list(signature.bind(*args, **kwargs).arguments.values())[which]
            calls.append((name, full.numel() * full.element_size()))
            return fn(*args, **kwargs)
        return counted
    # Horovod's DistributedOptimizer hands each gradient to `allreduce_async_` (fused on its background thread)
    hvd_opt = sys.modules.get("horovod.torch.optimizer")
    hvd_saved = getattr(hvd_opt, "allreduce_async_", None)
    global _RECORDING
    try:
        for name, fn in saved.items():
            setattr(dist, name, wrap(name, fn))
        if hvd_saved is not None:
            hvd_opt.allreduce_async_ = wrap("all_reduce", hvd_saved)
        _RECORDING = calls                          # ZeroSGD's ring phases record themselves
        yield calls
    finally:
        _RECORDING = None
        for name, fn in saved.items():
            setattr(dist, name, fn)
        if hvd_saved is not None:
            hvd_opt.allreduce_async_ = hvd_saved


def wire_bytes(name: str, full_bytes: int, N: int) -> float:
    """Bytes one rank sends for one collective on a ring of N: an allreduce of K, 2(N-1)/N·K; a reduce-scatter or
    an all-gather of K (the full tensor), (N-1)/N·K: each is one half of the allreduce."""
    return ring_bytes(N, full_bytes) / (1 if name == "all_reduce" else 2)


def sent_per_step(calls, N: int) -> float:
    """Bytes one rank sends in a step whose collectives `counting()` recorded, by the ring cost model."""
    return sum(wire_bytes(name, b, N) for name, b in calls)


def t_comm_buckets(N: int, bucket_bytes: list[int], alpha: float, B: float) -> float:
    """The α–β time of one allreduce per bucket, one after the other: Σ 2(N-1)α + 2(N-1)/N·K_b/B."""
    return float(sum(t_comm_ring(N, k, alpha, B) for k in bucket_bytes))
