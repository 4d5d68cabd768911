"""The α–β cost model of notebooks 02 and 03, measured by ping-pong, in one vocabulary:

    N workers, K bytes of gradient per worker, k servers, alpha (α) seconds per message, B bytes per second.

    t_comm_ps(N, K, alpha, B, k)     parameter server: 2 N α + max(2 N K / k, 2 K) / B (busiest link)
    t_comm_ring(N, K, alpha, B)      ring-allreduce:   2 (N-1) α + 2 (N-1)/N K / B
    ab = measure_alpha_beta(cluster) # ping-pong between two engines (plus the host's rate with all busy)
    fit_alpha_beta(sizes, seconds)   # the one fit: t = hops α + share K / B
    sizes(4 << 10, 64 << 20), human(K)  # message sizes of a sweep, and how they are written

The model is Hockney's (1994); the max-rate refinement for many streams through one host is Gropp, Olson &
Samfass (EuroMPI 2016).
"""
from __future__ import annotations

import os
import time

import numpy as np

from kit import env
from kit.comm.link import Link


# ----------------------------------------------------------------------------- the formulas
def t_comm_ps(N, K, alpha, B, k: int = 1):
    """Predict one PS step's communication: each server takes N pushes in and sends N pulls out, every message
    paying alpha; the bytes go at the pace of the busiest link. A server's link carries 2 N K / k (N pushes and N
    pulls of K/k), a worker's own link 2 K (it pushes and pulls its whole K, whatever k): so
    2 N alpha + max(2 N K / k, 2 K) / B. With k <= N that is 2 N (alpha + K / (k B)); more servers than workers
    cannot beat the worker's link (k = N, sharded as BytePS does: 2 K / B, the ring's 2(N-1)/N K / B x N/(N-1))."""
    N = np.asarray(N)
    return 2 * N * alpha + np.maximum(2 * N * K / k, 2 * K) / B


def t_comm_one_host(N, K, B, t_empty, B_max=None):
    """Predict one PS step's communication when servers and workers share one host: the measured time of an
    empty exchange (latency and scheduling, `kit.bench.ps.empty_exchange`) plus 2 N K / B_eff, every byte going in
    and out through the host whatever the number of servers. One stream moves B; N streams at once move at most
    N B and at most the host's B_max (the max-rate model): B_eff = min(B_max, N B)."""
    N = np.asarray(N)
    B_eff = B if B_max is None else np.minimum(B_max, B * N)
    return t_empty + 2 * N * K / B_eff


def ring_bytes(N: int, K: float) -> float:
    """Return the bytes each worker sends in a ring-allreduce of K bytes over N workers: 2(N-1)/N·K."""
    return 2 * (N - 1) / N * K


def t_comm_ring(N, K, alpha, B):
    """Return the ring's α–β time: 2(N-1) messages of latency α, 2(N-1)/N·K bytes at bandwidth B."""
    N = np.asarray(N, dtype=float)
    return 2 * (N - 1) * alpha + 2 * (N - 1) / N * K / B


def busbw(K: float, seconds: float, N: int) -> float:
    """Return the bus bandwidth (bytes/s) of an allreduce, the nccl-tests convention: K/time · 2(N-1)/N."""
    return K / seconds * 2 * (N - 1) / N


def fit_alpha_beta(sizes, seconds, hops: float = 1, share: float = 1, large: int = 1 << 20) -> tuple[float, float]:
    """Fit t = hops·alpha + share·K/B to measured (K bytes, seconds); return (alpha s, B bytes/s).

    A ping-pong's one-way time is hops=1, share=1; a ring over N ranks is hops=2(N-1), share=2(N-1)/N.
    B comes from the messages >= `large` bytes by least squares (gradients are large; small messages sit in
    caches and would flatter B), alpha from the smallest message; the two are refined together."""
    K, t = np.asarray(sizes, float), np.asarray(seconds, float)
    small, big = np.argmin(K), K >= min(large, K.max())
    alpha, B = t[small] / hops, np.inf
    for _ in range(50):   # a contraction: the bandwidth part of the smallest message is small
        extra = np.maximum(t[big] - hops * alpha, 1e-12)
        B = float(share * np.sum(K[big] ** 2) / np.sum(K[big] * extra))
        alpha = max(float((t[small] - share * K[small] / B) / hops), 0.0)
    return alpha, B


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


# ----------------------------------------------------------------------------- measuring (engines)
def pingpong(sizes: list[int], repeats: int, timeout: float = 60.0, pin: bool = True) -> dict | None:
    """Ranks 0 and 1 bounce messages of each size (bytes); rank 0 returns {size: median one-way seconds}.
    pin: each of the two runs on a core of its own while it measures (as MPI benchmarks bind their processes);
    left to the scheduler, the two sometimes share a core and B varies 2.5-4 GB/s from run to run here."""
    import torch
    import torch.distributed as dist
    rank = dist.get_rank()
    if rank > 1:
        return None
    cores = sorted(os.sched_getaffinity(0))
    before = env.pin_threads({cores[rank % len(cores)]}) if pin else None
    link, peer, name = Link(f"rank {rank}", timeout), 1 - rank, f"rank {1 - rank}"
    out = {}
    try:
        for size in sizes:
            buf, rounds = torch.zeros(max(1, size // 4)), []
            for _ in range(repeats + 2):                         # 2 warm-up rounds
                t0 = time.perf_counter()
                first, then = (link.isend, link.irecv) if rank == 0 else (link.irecv, link.isend)
                link.wait([first(buf, peer)], name)
                link.wait([then(buf, peer)], name)
                rounds.append((time.perf_counter() - t0) / 2)
            out[buf.numel() * 4] = float(np.median(rounds[2:]))   # the median is robust to a busy machine
    finally:
        if before is not None:
            env.pin_threads(before)
    return out if rank == 0 else None


def fan(size: int, repeats: int, hubs: int = 1, timeout: float = 60.0) -> float | None:
    """Ranks 0..hubs-1 are hubs, every other rank a spoke: each round every spoke sends size/hubs bytes to each hub
    at once and each hub sends size/hubs bytes back to every spoke (a bare PS exchange with every engine taking
    part); rank 0 returns the median bytes per second through the host."""
    import torch
    import torch.distributed as dist
    rank, n = dist.get_rank(), dist.get_world_size()
    link = Link(f"rank {rank}", timeout)
    peers = list(range(hubs, n)) if rank < hubs else list(range(hubs))
    names = [f"rank {p}" for p in peers]
    bufs = [torch.zeros(max(1, size // 4 // hubs)) for _ in peers]
    rounds = []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        if rank < hubs:
            link.wait([link.irecv(b, p) for b, p in zip(bufs, peers)], names)
            link.wait([link.isend(bufs[0], p) for p in peers], names)
        else:
            link.wait([link.isend(b, p) for b, p in zip(bufs, peers)], names)
            link.wait([link.irecv(b, p) for b, p in zip(bufs, peers)], names)
        rounds.append(time.perf_counter() - t0)
    moved = 2 * (n - hubs) * hubs * bufs[0].numel() * 4
    return moved / float(np.median(rounds[2:])) if rank == 0 else None


DEFAULT_SIZES = [4, 1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
FAN_SIZE = 8 << 20      # bytes per spoke in the saturation test (between the exchanges' 4 and 16 MB)


def measure_alpha_beta(cluster, sizes=DEFAULT_SIZES, repeats: int = 20, pin: bool = True, rounds: int = 3) -> dict:
    """Ping-pong between engines 0 and 1 (torch.distributed, gloo), each pinned to a core of its own unless
    pin=False, and the host's rate with every engine busy (`fan`, 1 and 2 hubs: the max-rate model's B_max).
    Each is measured `rounds` times, interleaved, and the median taken: single runs vary by 10-20% here.
    Return alpha, B, B_max {hubs: bytes/s} and the ping-pong's median seconds per size."""
    if cluster.size < 2:
        raise ValueError("ping-pong needs at least 2 engines: start the cluster with n >= 2")
    hubs = [h for h in (1, 2) if cluster.size >= h + 2]
    times, fans = [], {h: [] for h in hubs}
    for _ in range(rounds):
        res = cluster.wait(cluster.view.apply_async(pingpong, list(sizes), repeats, cluster.timeout, pin))[0]
        times.append(list(res.values()))
        for h in hubs:
            fans[h].append(cluster.wait(cluster.view.apply_async(fan, FAN_SIZE, repeats, h, cluster.timeout))[0])
    seconds = [float(t) for t in np.median(times, axis=0)]
    alpha, B = fit_alpha_beta(list(res), seconds)
    return {"alpha": alpha, "B": B, "sizes": list(res), "seconds": seconds,
            "B_max": {h: float(np.median(f)) for h, f in fans.items()}}
