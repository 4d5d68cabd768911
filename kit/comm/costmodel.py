"""The cost model of notebooks 02 and 03 (LogP-style α–β), measured by ping-pong, in one vocabulary:

    N workers, K bytes of gradient per worker, k servers, alpha (α) s per message, o s of serial overhead per
    extra concurrent message at one process, B bytes per second each way of a full-duplex link.

    t_comm_ring(N, K, alpha, B)            ring:  2(N-1) latencies in sequence: 2(N-1)(α + K/(N B))
    t_comm_ps(N, K, alpha, B, k, o)        PS:    2(α + (max(N,k)-1) o) + 2 max(N/k, 1) K/B  (push, then pull)
    t_comm_ps(..., pipelined=True)         BytePS: pushes and pulls overlap on full-duplex links: max(N/k, 1) K/B
    t_comm_colocated(N, K, alpha, B, o)    k = N servers on the workers: 2(α + (N-2) o) + 2(N-1)/N K/B
    bytes_per_direction(scheme, N, K, k)   the busiest link's bytes each way per step; lower_bound(...) its time
    crossover_bytes(N, alpha, B, o)        below this K the ring is slower than one server
    ab = measure_alpha_beta(cluster)       # ping-pong between two engines (plus the host's rate with all busy)
    fit_alpha_beta(sizes, seconds)         # the one fit: t = hops α + share K / B
    fit_latency(ns, seconds)               # the PS's empty step against N: (α, o)

Latency as the implementations pay it: a message's latency α (ping-pong's one-way time of a tiny message)
overlaps with other messages in flight, as in Hockney's and LogP's models; what a process cannot overlap is its
per-message overhead o (LogP's o: posting, copying, waking up for each one). A server that takes N pushes pays
α once and o for each of the other N-1, twice a step; the ring's 2(N-1) steps each wait for the previous one,
so its latencies add. Bytes are counted per direction of a full-duplex link: a ring rank sends 2(N-1)/N·K and
receives as much at the same time; one server receives N·K during the push and sends N·K during the pull.

Hockney (1994); Culler et al., LogP (1993); the max-rate refinement for many streams through one host is Gropp,
Olson & Samfass (EuroMPI 2016); BytePS: Jiang et al. (OSDI 2020).
"""
from __future__ import annotations

import os
import time

import numpy as np

from kit import env
from kit.comm.link import Link

SCHEMES = ("ring", "ps", "ps_pipelined", "colocated")


# ----------------------------------------------------------------------------- the formulas
def t_comm_ps(N, K, alpha, B, k: int = 1, o: float = 0.0, pipelined: bool = False):
    """Predict one PS step's communication with k servers on hosts of their own.

    Latency: the push and then the pull each pay alpha once (the N messages are in flight together) plus o for
    each further message the busiest process handles in turn: a server takes N, a worker sends k.
    Bytes per direction: a server receives N K/k during the push and sends N K/k during the pull, a worker sends
    K and receives K; the busiest link sets the pace: max(N/k, 1) K/B per phase. Unpipelined, the pull starts
    when the push has ended: 2 max(N/k, 1) K/B. Pipelined (BytePS: shard i is pulled while shard i+1 is pushed),
    the two directions of full-duplex links work at once: max(N/k, 1) K/B, K/B for k >= N."""
    N = np.asarray(N, dtype=float)
    phases = 1 if pipelined else 2
    return 2 * (alpha + (np.maximum(N, k) - 1) * o) + phases * np.maximum(N / k, 1) * K / B


def t_comm_colocated(N, K, alpha, B, o: float = 0.0):
    """Predict the PS sharded over k = N servers placed on the workers (`kit.comm.byteps`): each rank sends and
    receives (N-1)/N K at once in the push, again in the pull (the ring's bytes), in 2 latencies, each rank
    handling N-1 messages per phase: 2 (alpha + (N-2) o) + 2 (N-1)/N K/B."""
    N = np.asarray(N, dtype=float)
    return 2 * (alpha + np.maximum(N - 2, 0) * o) + 2 * (N - 1) / N * K / B


def t_comm_ring(N, K, alpha, B):
    """Return the ring's time: 2(N-1) steps in sequence, each a message of K/N bytes: 2(N-1)(alpha + K/(N B))."""
    N = np.asarray(N, dtype=float)
    return 2 * (N - 1) * (alpha + K / (N * B))


def bytes_per_direction(scheme: str, N: int, K: float, k: int = 1) -> float:
    """Return the bytes the busiest link carries in ONE direction per step (a full-duplex link carries as much
    the other way at the same time): ring 2(N-1)/N K per rank; PS (unpipelined or pipelined) max(N K/k, K): a
    server's N K/k in (and out), a worker's K; co-located servers 2(N-1)/N K, as the ring."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if scheme in ("ring", "colocated"):
        return ring_bytes(N, K)
    return max(N * K / k, K)


def lower_bound(scheme: str, N: int, K: float, B: float, k: int = 1) -> float:
    """Return the least time any step of `scheme` can take: its busiest link's bytes in one direction over B."""
    return bytes_per_direction(scheme, N, K, k) / B


def predict(scheme: str, N, K, alpha, B, k: int = 1, o: float = 0.0):
    """Return the model's time of `scheme` (one of SCHEMES), the one dispatch the notebooks and tests use."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if scheme == "ring":
        return t_comm_ring(N, K, alpha, B)
    if scheme == "colocated":
        return t_comm_colocated(N, K, alpha, B, o)
    return t_comm_ps(N, K, alpha, B, k, o, pipelined=scheme == "ps_pipelined")


def crossover_bytes(N, alpha, B, o: float = 0.0, alpha_ring: float | None = None) -> float:
    """Return the K below which the ring is slower than one unpipelined server (0: the ring always wins).
    Equal times: 2(N-1) a_r + 2(N-1)/N K/B = 2 alpha + 2(N-1) o + 2 N K/B, so
    K* = B ((N-1) a_r - alpha - (N-1) o) / (N - (N-1)/N), where a_r is what each of the ring's messages in
    sequence pays (`alpha_ring`; alpha where a step waits only for the link): with a_r = alpha the ring loses
    small messages when o < (N-2)/(N-1) alpha."""
    N = np.asarray(N, dtype=float)
    a_r = alpha if alpha_ring is None else alpha_ring
    return np.maximum(B * ((N - 1) * a_r - alpha - (N - 1) * o) / (N - (N - 1) / N), 0.0)


def latency_share(scheme: str, N, K, alpha, B, k: int = 1, o: float = 0.0):
    """Return the fraction of the model's time that is latency (alpha and o), the rest being bytes."""
    total = predict(scheme, N, K, alpha, B, k, o)
    return 1 - predict(scheme, N, K, 0.0, B, k, 0.0) / total


def fit_latency(ns, seconds, alpha: float | None = None) -> tuple[float, float]:
    """Fit an empty PS step t(N) = 2 (alpha + (N-1) o) to measured (N workers, seconds); return (alpha, o).
    With `alpha` given (the ping-pong's: one alpha for every N) o is the median of the per-N estimates
    (t - 2 alpha) / (2 (N-1)), so that one N hit by a scheduling spike does not set it. o close to alpha: the
    server pays its messages one after another (fully serial); o << alpha: latencies overlap, only o is serial."""
    n, t = np.asarray(ns, float) - 1, np.asarray(seconds, float)
    if alpha is not None:
        if not n.any():
            raise ValueError(f"fit_latency needs some N > 1 to fit o, got ns={list(ns)}")
        return float(alpha), float(np.median((t[n > 0] - 2 * alpha) / (2 * n[n > 0])))
    if len(set(n.tolist())) < 2:
        raise ValueError(f"fit_latency needs at least two different N, got ns={list(ns)}")
    slope, intercept = np.polyfit(n, t, 1)
    return float(intercept / 2), float(slope / 2)


def t_comm_one_host(N, K, B, t_empty, B_max=None):
    """Predict one PS step's communication when servers and workers share one host: the measured time of an
    empty exchange (latency and scheduling, `kit.comm.ps_measure.empty_exchange`) plus 2 N K / B_eff, every byte
    going in and out through the host whatever the number of servers. One stream moves B; N streams at once move at most
    N B and at most the host's B_max (the max-rate model): B_eff = min(B_max, N B)."""
    N = np.asarray(N)
    B_eff = B if B_max is None else np.minimum(B_max, B * N)
    return t_empty + 2 * N * K / B_eff


def ring_bytes(N: int, K: float) -> float:
    """Return the bytes each worker sends in a ring-allreduce of K bytes over N workers: 2(N-1)/N·K."""
    return 2 * (N - 1) / N * K


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


def allreduce_seconds(repeats: int = 20) -> list[float]:
    """On every engine: time `repeats` allreduces of one float (torch.distributed, a barrier before each, 2 warm-up
    calls); return this rank's seconds per call. Almost no bytes: the time is what an allreduce pays per call."""
    import torch
    import torch.distributed as dist
    x, out = torch.zeros(1), []
    for i in range(repeats + 2):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        out.append(time.perf_counter() - t0)
    return out[2:]


def measure_allreduce_alpha(cluster, repeats: int = 20) -> dict:
    """α as an allreduce pays it on these engines: the median over calls of the slowest rank's time for an allreduce
    of one float, over the ring's 2(N−1) messages in sequence. Return alpha, the call's seconds and their range."""
    per_rank = cluster.wait(cluster.view.apply_async(allreduce_seconds, repeats))
    calls = np.max(per_rank, axis=0)                      # each call ends when its slowest rank does
    seconds = float(np.median(calls))
    return {"alpha": seconds / (2 * (cluster.size - 1)), "seconds": seconds,
            "range": [float(calls.min()), float(calls.max())], "repeats": repeats}
