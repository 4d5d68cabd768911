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


_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64")
_MAX_DIMS = 8


def _describe(tensor):
    """Return (dtype code, ndim, shape...) as a fixed-length int64 tensor: the metadata ranks compare."""
    import zlib
    import torch
    name = str(tensor.dtype).removeprefix("torch.")
    shape = list(tensor.shape)
    code = _DTYPES.index(name) if name in _DTYPES else len(_DTYPES) + zlib.crc32(name.encode()) % 1000
    if len(shape) > _MAX_DIMS:   # fold the extra dimensions into a checksum slot
        shape = shape[:_MAX_DIMS - 1] + [zlib.crc32(str(shape).encode()) % (2**31)]
    return torch.tensor([code, tensor.dim(), *shape, *[-1] * (_MAX_DIMS - len(shape))], dtype=torch.int64)


def _decode(meta) -> str:
    code, ndim, *shape = meta.tolist()
    dtype = _DTYPES[code] if code < len(_DTYPES) else "other"
    return f"shape {tuple(shape[:ndim]) if ndim <= _MAX_DIMS else '(>8 dims)'}, {dtype}"


def check_same(tensor):
    """Raise RingError on every rank unless all ranks hold a tensor of one shape and dtype (moves no data)."""
    import torch.distributed as dist
    meta = _describe(tensor)
    every = [meta.clone() for _ in range(dist.get_world_size())]
    _guard(lambda: dist.all_gather(every, meta), "compare shapes")
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


def _send(piece, right, traffic):
    """Start sending one piece to the right neighbour; count its bytes."""
    import torch.distributed as dist
    traffic.sent += piece.numel() * piece.element_size()
    traffic.messages += 1
    traffic.peers.add(right)
    return dist.isend(piece, dst=right)


def _recv(into, left, traffic):
    """Start receiving one piece from the left neighbour; count its bytes."""
    import torch.distributed as dist
    traffic.received += into.numel() * into.element_size()
    return dist.irecv(into, src=left)


def _wait(reqs, what):
    for q in reqs:
        _guard(q.wait, what)


def _pieces(bounds: tuple[int, int], piece: int) -> list[tuple[int, int]]:
    """Cut the chunk [start, stop) into pieces of at most `piece` elements (none if the chunk is empty)."""
    start, stop = bounds
    return [(a, min(a + piece, stop)) for a in range(start, stop, max(piece, 1))]


def scatter_reduce(flat, rank, size, traffic, piece):
    """N-1 steps: send a chunk right while adding the one from the left; rank r ends owning chunk (r+1) % N.

    Each chunk moves as pieces of `piece` elements: the left neighbour's piece i+1 arrives in one scratch
    buffer while piece i is added from the other (double buffering: small, cache-sized scratch, no big copy).
    """
    bounds = chunk_bounds(flat.numel(), size)
    right, left = (rank + 1) % size, (rank - 1) % size
    scratch = [flat.new_empty(min(piece, max(b - a for a, b in bounds))) for _ in range(2)]
    for s in range(size - 1):
        out = _pieces(bounds[send_chunk(rank, s, size, "scatter_reduce")], piece)
        into = _pieces(bounds[recv_chunk(rank, s, size, "scatter_reduce")], piece)
        sends = [_send(flat[a:b], right, traffic) for a, b in out]   # send and receive overlap
        recvs = [_recv(scratch[i][:d - c], left, traffic) for i, (c, d) in enumerate(into[:2])]
        for i, (c, d) in enumerate(into):
            _wait([recvs[i]], f"scatter-reduce step {s + 1}")
            flat[c:d] += scratch[i % 2][:d - c]            # in place, on a view of the flat buffer
            if i + 2 < len(into):
                c2, d2 = into[i + 2]
                recvs.append(_recv(scratch[i % 2][:d2 - c2], left, traffic))
        _wait(sends, f"scatter-reduce step {s + 1}")


def allgather(flat, rank, size, traffic):
    """N-1 steps: pass the newest complete chunk right, receiving the left one straight into the flat buffer."""
    bounds = chunk_bounds(flat.numel(), size)
    right, left = (rank + 1) % size, (rank - 1) % size
    for s in range(size - 1):
        a, b = bounds[send_chunk(rank, s, size, "allgather")]
        c, d = bounds[recv_chunk(rank, s, size, "allgather")]
        reqs = [_send(flat[a:b], right, traffic)] if b > a else []    # send first: faster with gloo here
        reqs += [_recv(flat[c:d], left, traffic)] if d > c else []
        _wait(reqs, f"allgather step {s + 1}")


def allreduce(tensor, *, piece_bytes: int = 4 * 2**20, check: bool = True) -> Traffic:
    """Sum `tensor` over all ranks IN PLACE with the ring (neighbours only); return this rank's Traffic.

    Call it on every rank of the torch.distributed group (cluster.init_process_group()). piece_bytes: the size
    of the pieces a chunk is pipelined in; check: first compare shapes/dtypes across ranks (a tiny allgather).
    """
    import torch.distributed as dist
    t0 = time.perf_counter()
    rank, size = dist.get_rank(), dist.get_world_size()
    if check:
        check_same(tensor)
    traffic = Traffic()
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    if size > 1 and flat.numel():
        scatter_reduce(flat, rank, size, traffic, max(1, piece_bytes // flat.element_size()))
        allgather(flat, rank, size, traffic)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    traffic.seconds = time.perf_counter() - t0
    return traffic


def allreduce_naive(tensor, *, check: bool = True) -> Traffic:
    """Sum `tensor` IN PLACE the parameter-server way: everyone sends to rank 0, rank 0 sends the sum back.

    Here to learn from: rank 0 receives and sends (N-1)·K bytes, so its link is the bottleneck as N grows.
    """
    import torch.distributed as dist
    t0 = time.perf_counter()
    rank, size = dist.get_rank(), dist.get_world_size()
    if check:
        check_same(tensor)
    traffic = Traffic()
    flat = tensor.contiguous().view(-1)
    nbytes = flat.numel() * flat.element_size()
    if size > 1 and flat.numel():
        if rank == 0:
            inbox = [flat.new_empty(flat.numel()) for _ in range(1, size)]
            reqs = [dist.irecv(buf, src=src) for src, buf in enumerate(inbox, start=1)]
            for q, buf in zip(reqs, inbox):
                _guard(q.wait, "gather to rank 0")
                flat += buf
            traffic.received += nbytes * (size - 1)
            _wait([dist.isend(flat, dst=dst) for dst in range(1, size)], "broadcast from rank 0")
            traffic.sent += nbytes * (size - 1)
            traffic.messages += size - 1
            traffic.peers |= set(range(1, size))
        else:
            _wait([dist.isend(flat, dst=0)], "send to rank 0")
            _wait([dist.irecv(flat, src=0)], "receive from rank 0")
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
    """Wait for every rank: torch.distributed's barrier where the group exists, else Horovod's."""
    import sys
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
    elif "horovod.torch" in sys.modules:
        sys.modules["horovod.torch"].barrier()


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


def allreduce_fused(tensors, name=None):
    """Copy the tensors into one flat buffer, allreduce it once, copy the sums back: tensor fusion by hand."""
    import torch
    flat = torch.cat([t.reshape(-1) for t in tensors])
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


_fusion_modes = {("ring", "one_by_one"): _ring_one_by_one, ("ring", "fused"): allreduce_fused,
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
    from .ps import t_comm_ps   # notebook 02's parameter-server model
    ns = np.unique(np.geomspace(2, 1024, 60).astype(int)) if ns is None else np.asarray(ns)
    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    ax.plot(ns, t_comm_ring(ns, k, alpha, b), label="ring model: 2(N-1)α + 2(N-1)/N·K/B")
    ax.plot(ns, t_comm_ps(ns, k, alpha, b), label="parameter server model (one server)")
    for (impl, points), color, marker in zip((measured or {}).items(), ("C0", "C1"), ("o", "s")):
        ax.plot(list(points), list(points.values()), marker, color=color, mfc="none", mew=2, ms=9,
                label=f"measured: {impl}")
    ax.set(xscale="log", yscale="log", xlabel="workers N", ylabel="time per allreduce (s)",
           title=f"K = {human(k)}, α = {alpha * 1e6:.0f} µs, B = {b / 1e9:.2f} GB/s (measured here)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def fusion_table(view, count: int = 100, numel: int = 1024, reps: int = 3, impls=("ring", "horovod")) -> dict:
    """Return {impl: {"one_by_one": s, "fused": s}} for `count` tensors of `numel` float32 (slowest rank)."""
    out = {}
    for impl in impls:
        per_rank = view.apply_sync(time_fusion, impl, count, numel, reps)
        out[impl] = {mode: max(r[mode] for r in per_rank) for mode in ("one_by_one", "fused")}
    return out


def plot_fusion(fusion: dict, count: int, ax=None):
    """Bar chart: time for `count` small allreduces, one by one vs fused, per implementation."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(8, 3.8))[1]
    names = list(fusion)
    x = np.arange(len(names))
    for i, mode in enumerate(("one_by_one", "fused")):
        ax.bar(x + (i - 0.5) * 0.38, [fusion[k][mode] * 1e3 for k in names], 0.38, label=mode.replace("_", " "))
    ax.set_xticks(x, [k.replace(" (", "\n(").replace(", ", ",\n") for k in names], fontsize=8)
    ax.set(yscale="log", ylabel="ms (log)", title=f"{count} small tensors: one by one vs fused")
    ax.legend()
    return ax


# ----------------------------------------------------------------------------------- the benchmark
LABELS = {"ring": "kit ring", "naive": "naive (gather to rank 0 + broadcast)", "torch": "torch.distributed (gloo)"}


def bench(out_dir, quick: bool = False):
    """python -m kit.bench allreduce: busbw vs size for 5 implementations at N=2, fusion, model vs N."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from . import cluster as kc
    from . import ps
    reps, hi = (2, 64 * 2**20) if quick else (5, 256 * 2**20)
    grid = sizes(4 * 2**10, hi, 16 if quick else 4)
    k_model, goal = 16 * 2**20, 64 * 2**20
    grid = sorted({*grid, goal})
    records, fusion, model_points = [], {}, {"kit ring": {}, "naive, N+1 ranks (rank 0 = server)": {}}
    with kc.start(n=2, backend="gloo", quiet=True) as c:
        c.init_process_group()
        for impl in ("ring", "naive", "torch", "horovod"):
            records += measure(c.view, impl, grid, reps, label=LABELS.get(impl, "Horovod (Gloo)"))
        ab = ps.measure_alpha_beta(c)
        model_points["kit ring"][2] = measure(c.view, "ring", [k_model], reps)[0]["seconds"]
        f = fusion_table(c.view)
        fusion.update({"kit ring": f["ring"], "Horovod (Gloo)": f["horovod"]})
        c.view.apply_sync(horovod_restart, fusion_threshold=0)
        fusion["Horovod (Gloo), fusion off"] = fusion_table(c.view, impls=("horovod",))["horovod"]
    with kc.start(n=2, backend="mpi", quiet=True) as c:   # Horovod only: no torch.distributed group here
        records += measure(c.view, "horovod", grid, reps, label="Horovod (MPI)")
        fusion["Horovod (MPI)"] = fusion_table(c.view, impls=("horovod",))["horovod"]
        c.view.apply_sync(horovod_restart, cycle_time=10)
        fusion["Horovod (MPI), cycle 10 ms"] = fusion_table(c.view, impls=("horovod",))["horovod"]
    for n in (3,) if quick else (3, 4):
        with kc.start(n=n, backend="gloo", quiet=True) as c:
            c.init_process_group()
            model_points["kit ring"][n] = measure(c.view, "ring", [k_model], reps)[0]["seconds"]
            model_points["naive, N+1 ranks (rank 0 = server)"][n - 1] = \
                measure(c.view, "naive", [k_model], reps)[0]["seconds"]
    plot_busbw(records)
    plt.savefig(out_dir / "allreduce.png", dpi=120, bbox_inches="tight")
    plot_model(ab["alpha"], ab["B"], k_model, model_points)
    plt.savefig(out_dir / "allreduce_model.png", dpi=120, bbox_inches="tight")
    plot_fusion(fusion, 100)
    plt.savefig(out_dir / "allreduce_fusion.png", dpi=120, bbox_inches="tight")
    plt.close("all")
    at = {r["impl"]: r["busbw"] for r in records if r["bytes"] == goal}
    ring_bw, gloo, mpi = at["kit ring"], at["Horovod (Gloo)"], at["Horovod (MPI)"]
    result = {"records": records, "alpha_s": ab["alpha"], "B_bytes_per_s": ab["B"], "model_bytes": k_model,
              "model_points": {k: {str(n): s for n, s in v.items()} for k, v in model_points.items()},
              "fusion_100x4KB_s": fusion, "ring_vs_horovod_busbw_64MB": {"gloo": ring_bw / gloo, "mpi": ring_bw / mpi},
              "all_correct": all(r["ok"] for r in records)}
    summary = (f"allreduce N=2, 64 MB, busbw: kit ring {ring_bw / 1e9:.2f} GB/s, torch.distributed "
               f"{at['torch.distributed (gloo)'] / 1e9:.2f}, Horovod Gloo {gloo / 1e9:.2f}, Horovod MPI {mpi / 1e9:.2f}"
               f" -> kit ring = {ring_bw / max(gloo, mpi):.0%} of the best Horovod ({ring_bw / gloo:.0%} of Gloo, "
               f"{ring_bw / mpi:.0%} of MPI; goal >= 50%)")
    return result, summary
