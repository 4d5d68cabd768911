"""Ring-allreduce (notebook 03): a pure simulation to watch step by step, then the real thing on engines.

    results, steps = kit.ring.simulate(arrays)     # any N, any equal-shape arrays: what each worker holds
    kit.ring.plot_steps(steps)                     # one figure per step, workers on a circle
    %%px
    traffic = kit.ring.allreduce(tensor)           # in place, neighbours only; returns the bytes this rank sent

The ring is Baidu's (Gibiansky 2017, "Bringing HPC techniques to deep learning"); N-1 scatter-reduce steps,
then N-1 allgather steps. Chunk c of worker r travels to worker (r + 1) % N, its right neighbour.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


# ----------------------------------------------------------------------------------- the schedule
def chunk_bounds(length: int, n: int) -> list[tuple[int, int]]:
    """Split range(length) into n contiguous chunks whose sizes differ by at most one (np.array_split's rule)."""
    q, r = divmod(length, n)
    starts = [c * q + min(c, r) for c in range(n + 1)]
    return list(zip(starts[:-1], starts[1:]))


def send_chunk(rank: int, step: int, n: int, phase: str) -> int:
    """Return the chunk `rank` sends to its right neighbour at `step` of `phase` ("scatter_reduce"/"allgather")."""
    return (rank - step + (phase == "allgather")) % n


def recv_chunk(rank: int, step: int, n: int, phase: str) -> int:
    """Return the chunk `rank` receives from its left neighbour at `step` of `phase` (what the left one sends)."""
    return send_chunk((rank - 1) % n, step, n, phase)


# ----------------------------------------------------------------------------------- the simulation
@dataclass
class Step:
    """The state of every worker after one step of the simulated ring."""
    phase: str                            # "start", "scatter_reduce" or "allgather"
    index: int                            # step number within the phase (0 for "start")
    sends: list[tuple[int, int, int]]     # (from worker, to worker, chunk) moved in this step
    contributions: np.ndarray             # [worker, chunk] -> how many workers' inputs that chunk now sums
    buffers: list[np.ndarray]             # each worker's (flat) buffer after the step: the partial sums

    @property
    def title(self) -> str:
        return "start" if self.phase == "start" else f"{self.phase.replace('_', '-')} step {self.index + 1}"


def simulate(arrays) -> tuple[list[np.ndarray], list[Step]]:
    """Run ring-allreduce on a list of equal-shape arrays (one per worker); return (results, steps).

    steps[0] is the starting state, then N-1 scatter-reduce steps and N-1 allgather steps follow.
    """
    arrays = [np.asarray(a) for a in arrays]
    n = len(arrays)
    if n == 0:
        raise ValueError("simulate needs at least one worker's array")
    if len({(a.shape, a.dtype) for a in arrays}) > 1:
        raise ValueError(f"every worker needs the same shape and dtype, got {[(a.shape, str(a.dtype)) for a in arrays]}")
    buffers = [a.reshape(-1).copy() for a in arrays]
    bounds = chunk_bounds(buffers[0].size, n)
    held = np.ones((n, n), dtype=int)
    steps = [Step("start", 0, [], held.copy(), [b.copy() for b in buffers])]
    for phase in ("scatter_reduce", "allgather"):
        for s in range(n - 1):
            sends = [(r, (r + 1) % n, send_chunk(r, s, n, phase)) for r in range(n)]
            # Every worker sends at the same time: read all outgoing chunks before anyone updates.
            out = [buffers[src][slice(*bounds[c])].copy() for src, _, c in sends]
            counts = [held[src, c] for src, _, c in sends]
            for (src, dst, c), data, k in zip(sends, out, counts):
                if phase == "scatter_reduce":
                    buffers[dst][slice(*bounds[c])] += data
                    held[dst, c] += k
                else:
                    buffers[dst][slice(*bounds[c])] = data
                    held[dst, c] = k
            steps.append(Step(phase, s, sends, held.copy(), [b.copy() for b in buffers]))
    return [b.reshape(arrays[0].shape) for b in buffers], steps


# ----------------------------------------------------------------------------------- figures
def draw_step(step: Step, ax=None):
    """Draw one step: workers on a circle, each a row of chunks coloured by how many inputs they sum."""
    import matplotlib.pyplot as plt
    n = step.contributions.shape[0]
    ax = ax or plt.subplots(figsize=(4, 4))[1]
    cmap = plt.get_cmap("viridis", n)
    angle = np.pi / 2 - 2 * np.pi * np.arange(n) / n          # worker 0 on top, clockwise
    xy = np.c_[np.cos(angle), np.sin(angle)]
    w = min(0.9 / n, 0.25)
    for r in range(n):
        x0 = xy[r, 0] - n * w / 2
        for c in range(n):
            k = step.contributions[r, c]
            ax.add_patch(plt.Rectangle((x0 + c * w, xy[r, 1] - w / 2), w, w, color=cmap(k - 1), ec="white"))
            if n <= 8:
                ax.text(x0 + (c + .5) * w, xy[r, 1], str(c), ha="center", va="center", fontsize=7,
                        color="white" if k < n else "black")
        ax.text(xy[r, 0], xy[r, 1] + w, f"worker {r}", ha="center", va="bottom", fontsize=8)
    for src, dst, c in step.sends:
        a, b = xy[src] * 0.8, xy[dst] * 0.8
        ax.annotate("", b, a, arrowprops=dict(arrowstyle="->", color="tab:red", connectionstyle="arc3,rad=-0.25"))
        mid = (a + b) / 2 * 0.75
        if n <= 8:
            ax.text(*mid, f"c{c}", color="tab:red", fontsize=7, ha="center", va="center")
    ax.set(xlim=(-1.4, 1.4), ylim=(-1.4, 1.4), aspect="equal", title=step.title)
    ax.axis("off")
    return ax


def plot_steps(steps: list[Step], cols: int = 4):
    """Draw every step as a small multiple (the static figure; renders anywhere, also under nbval)."""
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm
    n = steps[0].contributions.shape[0]
    rows = -(-len(steps) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3 * cols, 3 * rows), squeeze=False)
    for ax in axes.flat[len(steps):]:
        ax.axis("off")
    for step, ax in zip(steps, axes.flat):
        draw_step(step, ax)
    norm = BoundaryNorm(np.arange(0.5, n + 1), n)
    bar = fig.colorbar(ScalarMappable(norm, plt.get_cmap("viridis", n)), ax=axes, shrink=0.6, ticks=range(1, n + 1))
    bar.set_label("inputs summed in the chunk")
    return fig


def step_slider(steps: list[Step]):
    """Show a slider to step through the ring (needs ipywidgets); fall back to the static figure without it."""
    import matplotlib.pyplot as plt
    try:
        import ipywidgets as widgets
    except ImportError:
        return plot_steps(steps)

    def show(step):
        draw_step(steps[step])
        plt.show()
    return widgets.interact(show, step=widgets.IntSlider(0, 0, len(steps) - 1, description="step"))


# ----------------------------------------------------------------------------------- the real ring (engines)
class RingError(RuntimeError):
    """The ring cannot run: ranks disagree on the tensor, or a neighbour stopped answering."""


@dataclass
class Traffic:
    """What one rank put on the wire in one allreduce."""
    sent: int = 0            # bytes sent
    received: int = 0        # bytes received
    messages: int = 0        # point-to-point sends
    seconds: float = 0.0     # wall time of the call
    peers: set = field(default_factory=set)   # ranks this rank sent to

    def __iadd__(self, other: "Traffic"):
        self.sent += other.sent
        self.received += other.received
        self.messages += other.messages
        self.seconds += other.seconds
        self.peers |= other.peers
        return self


_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64")
_MAX_DIMS = 8


def _describe(tensor) -> "torch.Tensor":
    """Return (dtype code, ndim, shape...) as a fixed-length int64 tensor: the metadata ranks compare."""
    import torch
    name = str(tensor.dtype).removeprefix("torch.")
    shape = list(tensor.shape)
    code = _DTYPES.index(name) if name in _DTYPES else len(_DTYPES) + hash(name) % 1000
    if len(shape) > _MAX_DIMS:   # fold the extra dimensions into a checksum slot
        shape = shape[:_MAX_DIMS - 1] + [hash(tuple(shape)) % (2**31)]
    return torch.tensor([code, tensor.dim(), *shape, *[-1] * (_MAX_DIMS - len(shape))], dtype=torch.int64)


def _decode(meta) -> str:
    code, ndim, *shape = meta.tolist()
    dtype = _DTYPES[code] if code < len(_DTYPES) else "other"
    return f"shape {tuple(shape[:ndim]) if ndim <= _MAX_DIMS else '(>8 dims)'}, {dtype}"


def check_same(tensor, group=None):
    """Raise RingError on every rank unless all ranks hold a tensor of one shape and dtype (moves no data)."""
    import torch.distributed as dist
    meta = _describe(tensor)
    every = [meta.clone() for _ in range(dist.get_world_size(group))]
    _guard(lambda: dist.all_gather(every, meta, group=group), "compare shapes")
    if any(not m.equal(every[0]) for m in every):
        have = "; ".join(f"rank {r}: {_decode(m)}" for r, m in enumerate(every))
        raise RingError(f"allreduce needs one shape and dtype on every rank, got {have}")


def _guard(call, what):
    """Run a communication call; turn a gloo failure (dead peer, timeout) into RingError saying what failed."""
    import torch.distributed as dist
    try:
        return call()
    except RingError:
        raise
    except (RuntimeError, dist.DistBackendError) as e:
        raise RingError(f"rank {dist.get_rank()}: {what} failed, a neighbour is dead or not answering "
                        f"(the process group's timeout): {e}") from e


def _exchange(send, recv, right, left, traffic, group=None):
    """Send `send` to the right and receive `recv` from the left at the same time (one chunk time, not two)."""
    import torch.distributed as dist
    reqs = []
    if recv.numel():
        reqs.append(dist.irecv(recv, src=left, group=group))
    if send.numel():
        reqs.append(dist.isend(send, dst=right, group=group))
        traffic.sent += send.numel() * send.element_size()
        traffic.messages += 1
        traffic.peers.add(right)
    traffic.received += recv.numel() * recv.element_size()
    return reqs


def _wait(reqs, what):
    for q in reqs:
        _guard(q.wait, what)


def _pieces(bounds: tuple[int, int], pipeline: int) -> list[tuple[int, int]]:
    """Cut one chunk into `pipeline` sub-chunks, so adding one overlaps receiving the next."""
    start, stop = bounds
    return [(start + a, start + b) for a, b in chunk_bounds(stop - start, pipeline)]


def scatter_reduce(flat, rank, size, traffic, pipeline=1, group=None):
    """N-1 steps: each rank sends a chunk right, adds the one from the left; rank r ends owning chunk (r+1) % N."""
    bounds = chunk_bounds(flat.numel(), size)
    right, left = (rank + 1) % size, (rank - 1) % size
    scratch = flat.new_empty(max(b - a for a, b in bounds))   # receive buffer, reused every step
    for s in range(size - 1):
        out = _pieces(bounds[send_chunk(rank, s, size, "scatter_reduce")], pipeline)
        into = _pieces(bounds[recv_chunk(rank, s, size, "scatter_reduce")], pipeline)
        reqs = []
        for (a, b), (c, d) in zip(out, into):
            reqs.append(_exchange(flat[a:b], scratch[c - into[0][0]:d - into[0][0]], right, left, traffic, group))
        for (c, d), pair in zip(into, reqs):
            _wait(pair, f"scatter-reduce step {s + 1}")
            flat[c:d] += scratch[c - into[0][0]:d - into[0][0]]   # in place, on a view of the flat buffer


def allgather(flat, rank, size, traffic, group=None):
    """N-1 steps: each rank passes the newest complete chunk right, receiving straight into its own buffer."""
    bounds = chunk_bounds(flat.numel(), size)
    right, left = (rank + 1) % size, (rank - 1) % size
    for s in range(size - 1):
        a, b = bounds[send_chunk(rank, s, size, "allgather")]
        c, d = bounds[recv_chunk(rank, s, size, "allgather")]
        _wait(_exchange(flat[a:b], flat[c:d], right, left, traffic, group), f"allgather step {s + 1}")


def allreduce(tensor, *, pipeline: int | None = None, check: bool = True, group=None) -> Traffic:
    """Sum `tensor` over all ranks IN PLACE with the ring (neighbours only); return this rank's Traffic.

    Call it on every rank of the torch.distributed group (cluster.init_process_group()). pipeline: sub-chunks per
    chunk (default: about 1 MB each); check: first compare shapes/dtypes across ranks (a tiny allgather).
    """
    import torch.distributed as dist
    t0 = time.perf_counter()
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if check:
        check_same(tensor, group)
    traffic = Traffic()
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    if size > 1 and flat.numel():
        chunk_bytes = flat.numel() * flat.element_size() / size
        pipeline = pipeline or max(1, min(16, round(chunk_bytes / 2**20)))
        scatter_reduce(flat, rank, size, traffic, pipeline, group)
        allgather(flat, rank, size, traffic, group)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    traffic.seconds = time.perf_counter() - t0
    return traffic


def allreduce_naive(tensor, *, check: bool = True, group=None) -> Traffic:
    """Sum `tensor` IN PLACE the parameter-server way: everyone sends to rank 0, rank 0 sends the sum back.

    Here to learn from: rank 0 receives and sends (N-1)·K bytes, so its link is the bottleneck as N grows.
    """
    import torch.distributed as dist
    t0 = time.perf_counter()
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if check:
        check_same(tensor, group)
    traffic = Traffic()
    flat = tensor.contiguous().view(-1)
    nbytes = flat.numel() * flat.element_size()
    if size > 1 and flat.numel():
        if rank == 0:
            inbox = [flat.new_empty(flat.numel()) for _ in range(1, size)]
            reqs = [dist.irecv(buf, src=src, group=group) for src, buf in enumerate(inbox, start=1)]
            for q, buf in zip(reqs, inbox):
                _guard(q.wait, "gather to rank 0")
                flat += buf
            traffic.received += nbytes * (size - 1)
            _wait([dist.isend(flat, dst=dst, group=group) for dst in range(1, size)], "broadcast from rank 0")
            traffic.sent += nbytes * (size - 1)
            traffic.messages += size - 1
            traffic.peers |= set(range(1, size))
        else:
            _wait([dist.isend(flat, dst=0, group=group)], "send to rank 0")
            _wait([dist.irecv(flat, src=0, group=group)], "receive from rank 0")
            traffic.sent, traffic.received, traffic.messages, traffic.peers = nbytes, nbytes, 1, {0}
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    traffic.seconds = time.perf_counter() - t0
    return traffic


# ----------------------------------------------------------------------------------- the cost model
def ring_bytes(n: int, k: float) -> float:
    """Return the bytes each worker sends in a ring-allreduce of K bytes over N workers: 2(N-1)/N·K."""
    return 2 * (n - 1) / n * k


def t_comm_ring(n, k, alpha, b):
    """Return the ring's α–β time: 2(N-1) messages of latency α, 2(N-1)/N·K bytes at bandwidth B."""
    n = np.asarray(n, dtype=float)
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * k / b


def busbw(nbytes: float, seconds: float, n: int) -> float:
    """Return the bus bandwidth (bytes/s) of an allreduce, the nccl-tests convention: size/time · 2(N-1)/N."""
    return nbytes / seconds * 2 * (n - 1) / n


def t_comm_ps(n, k, alpha, b):
    """Return the parameter-server time from notebook 02 (kit.ps); inline 2(α + N·K/B) until kit.ps has it."""
    try:
        from .ps import t_comm_ps as from_ps
    except ImportError:
        n = np.asarray(n, dtype=float)
        return 2 * (alpha + n * k / b)
    return from_ps(n, k, alpha, b)


def fit_alpha_beta(n: int, nbytes, seconds) -> tuple[float, float]:
    """Fit the ring model to measured (bytes, seconds) at N ranks; return (α in s, B in bytes/s).

    Least squares on relative error, so that 4 KB and 256 MB weigh alike.
    """
    k, t = np.asarray(nbytes, float), np.asarray(seconds, float)
    a = np.c_[np.full_like(k, 2 * (n - 1)), 2 * (n - 1) / n * k] / t[:, None]
    (alpha, inv_b), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return max(alpha, 0.0), 1 / inv_b


# ----------------------------------------------------------------------------------- measuring (engines)
IMPLS = ("ring", "naive", "torch", "horovod")


def _barrier():
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()


def time_allreduce(impl: str, nbytes: int, reps: int = 3, dtype: str = "float32") -> dict:
    """Time `reps` allreduces of `nbytes` with one implementation on this rank (call it on every engine).

    Returns {"seconds": one per rep, "sent": bytes this rank sent (ring/naive only, counted), "ok": correct?}.
    """
    import torch
    x = torch.full((nbytes // torch.empty(0, dtype=getattr(torch, dtype)).element_size(),), 1.0,
                   dtype=getattr(torch, dtype))
    run = _runner(impl)
    seconds, sent, ok = [], None, True
    for i in range(reps + 1):                       # one warm-up call, not timed
        y = x.clone()
        _barrier()
        t0 = time.perf_counter()
        out = run(y, f"t{nbytes}.{i}")
        dt = time.perf_counter() - t0
        y = out if isinstance(out, torch.Tensor) else y
        ok = ok and bool((y == _world_size()).all())
        if i:
            seconds.append(dt)
        if isinstance(out, Traffic):
            sent = out.sent
    return {"seconds": seconds, "sent": sent, "ok": ok}


def _world_size() -> int:
    import os
    return int(os.environ.get("KIT_SIZE", 1))


def _runner(impl: str):
    """Return f(tensor, name) that sums `tensor` over the ranks with `impl`."""
    if impl == "ring":
        return lambda t, name: allreduce(t)
    if impl == "naive":
        return lambda t, name: allreduce_naive(t)
    if impl == "torch":
        import torch.distributed as dist
        return lambda t, name: dist.all_reduce(t)
    if impl == "horovod":
        import horovod.torch as hvd
        return lambda t, name: hvd.allreduce(t, op=hvd.Sum, name=name)
    raise ValueError(f"unknown implementation {impl!r}: use one of {IMPLS}")


def time_fusion(impl: str, count: int = 100, numel: int = 1024, reps: int = 3) -> dict:
    """Time `count` small allreduces one by one vs as one fused call ("ring" or "horovod"); best of reps, s."""
    import torch
    tensors = [torch.ones(numel) for _ in range(count)]
    out = {}
    for mode in ("one_by_one", "fused"):
        best = float("inf")
        for r in range(reps + 1):
            _barrier()
            t0 = time.perf_counter()
            _fusion_modes[impl, mode](tensors, f"{mode}{r}")
            best = min(best, time.perf_counter() - t0) if r else best
        out[mode] = best
    return out


def _ring_one_by_one(tensors, name):
    for t in tensors:
        allreduce(t)


def _ring_fused(tensors, name):
    """Copy the tensors into one flat buffer, allreduce it once, copy the sums back: tensor fusion by hand."""
    import torch
    flat = torch.cat([t.view(-1) for t in tensors])
    allreduce(flat)
    for t, piece in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(piece.view_as(t))


def _horovod_one_by_one(tensors, name):
    import horovod.torch as hvd
    for i, t in enumerate(tensors):
        hvd.allreduce_(t, op=hvd.Sum, name=f"{name}.{i}")


def _horovod_fused(tensors, name):
    """Hand all tensors to Horovod at once (async); its background thread fuses those ready in one cycle."""
    import horovod.torch as hvd
    handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=f"{name}.{i}") for i, t in enumerate(tensors)]
    for h in handles:
        hvd.synchronize(h)


_fusion_modes = {("ring", "one_by_one"): _ring_one_by_one, ("ring", "fused"): _ring_fused,
                 ("horovod", "one_by_one"): _horovod_one_by_one, ("horovod", "fused"): _horovod_fused}


def horovod_restart(**env) -> dict:
    """Shut Horovod (torch) down, set HOROVOD_* variables, init again; return the settings now in force.

    Horovod reads HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME at init only. Measured here: one restart per
    job works (Gloo and MPI); a second one killed the engines, so change both settings in one restart.
    """
    import os
    import horovod.torch as hvd
    hvd.shutdown()
    os.environ.update({f"HOROVOD_{k.upper()}": str(v) for k, v in env.items()})
    hvd.init()
    return {k: os.environ[k] for k in sorted(os.environ) if k in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME")}


# ----------------------------------------------------------------------------------- measuring (notebook side)
def measure(view, impl: str, sizes, reps: int = 3, label: str | None = None) -> list[dict]:
    """Time `impl` on every engine of `view` for each size; one record per size (slowest rank, median of reps)."""
    n, records = len(view), []
    for nbytes in sizes:
        per_rank = view.apply_sync(time_allreduce, impl, int(nbytes), reps)
        seconds = float(np.median(np.max([r["seconds"] for r in per_rank], axis=0)))
        records.append({"impl": label or impl, "n": n, "bytes": int(nbytes), "seconds": seconds,
                        "algbw": nbytes / seconds, "busbw": busbw(nbytes, seconds, n),
                        "sent": [r["sent"] for r in per_rank], "ok": all(r["ok"] for r in per_rank)})
    return records


def sizes(lo: int = 4 * 2**10, hi: int = 64 * 2**20, factor: int = 4) -> list[int]:
    """Return message sizes from lo to hi bytes, each `factor` times the last (4 KB ... 64 MB by default)."""
    out = [lo]
    while out[-1] * factor <= hi:
        out.append(out[-1] * factor)
    return out


def human(nbytes: float) -> str:
    """Return 4 KB, 64 MB, ... (binary units, as the sizes are powers of two)."""
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if nbytes == int(nbytes) else f"{nbytes:.1f} {unit}"
        nbytes /= 1024


def table(records: list[dict], at: int) -> list[tuple[str, float, float]]:
    """Return (implementation, ms, busbw GB/s) for every implementation measured at `at` bytes."""
    return [(r["impl"], r["seconds"] * 1e3, r["busbw"] / 1e9) for r in records if r["bytes"] == at]


def plot_busbw(records: list[dict], ax=None):
    """Plot busbw against message size, one line per implementation, log-log."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    for impl in dict.fromkeys(r["impl"] for r in records):
        rs = [r for r in records if r["impl"] == impl]
        ax.plot([r["bytes"] for r in rs], [r["busbw"] / 1e9 for r in rs], "o-", label=impl)
    ticks = sorted({r["bytes"] for r in records})
    ax.set(xscale="log", yscale="log", xlabel="message size K", ylabel="busbw (GB/s) = K/t · 2(N-1)/N",
           title=f"allreduce over N = {records[0]['n']} ranks on this machine")
    ax.set_xticks(ticks, [human(t) for t in ticks], rotation=45)
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend()
    return ax


def plot_model(alpha: float, b: float, k: int, measured: dict | None = None, ns=None, ax=None):
    """Plot the α–β time of ring vs parameter server for N = 2 ... 1024, with measured points {impl: {N: s}}."""
    import matplotlib.pyplot as plt
    ns = np.unique(np.geomspace(2, 1024, 60).astype(int)) if ns is None else np.asarray(ns)
    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    ax.plot(ns, t_comm_ring(ns, k, alpha, b), label="ring model: 2(N-1)α + 2(N-1)/N·K/B")
    ax.plot(ns, t_comm_ps(ns, k, alpha, b), label="parameter server model (one server)")
    for (impl, points), marker in zip((measured or {}).items(), "os^D"):
        ax.plot(list(points), list(points.values()), marker, ms=8, label=f"measured: {impl}")
    ax.set(xscale="log", yscale="log", xlabel="workers N", ylabel="time per allreduce (s)",
           title=f"K = {human(k)}, α = {alpha * 1e6:.0f} µs, B = {b / 1e9:.2f} GB/s (fitted here)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax
