"""A parameter server on real processes: workers push gradients, servers average and update, workers pull.

    cluster = kit.cluster.start(n=N + k); cluster.init_process_group()
    run = kit.ps.train(cluster, kit.ps.Config(workers=N, servers=k, mode="sync"))
    run.params, run.server_bytes(), run.times()

Ranks 0..k-1 are servers (server s owns shard s of the flat parameter vector); ranks k..k+N-1 are workers.
Every tensor travels as a torch.distributed message (gloo isend/irecv); `Link` counts the bytes it moves.
The cost model `t_comm_ps` and `measure_alpha_beta` are reused by notebook 03 (ring allreduce).
"""
from __future__ import annotations

import datetime
import gc
import os
import time
from dataclasses import dataclass, field

import numpy as np

MODES = ("sync", "async")


class PSError(RuntimeError):
    """A parameter-server run failed; the message says which rank did what."""


class PeerLostError(PSError):
    """A message from (or to) another rank did not arrive in time: that rank died or stopped."""


@dataclass(frozen=True)
class Config:
    """One parameter-server run: who takes part, what is trained, for how long."""
    workers: int = 2            # N
    servers: int = 1            # k: server s owns shard s of the parameters
    mode: str = "sync"          # "sync": barrier per step; "async": apply each push as it arrives
    steps: int = 30             # steps per worker
    batch: int = 120            # global batch per step, split evenly over the workers (120: N = 1..6)
    lr: float = 0.1
    hidden: int = 128           # MLP 784 -> hidden -> 10
    seed: int = 0
    data: str = "auto"          # kit.datasets.load(data)
    exchange_only: int = 0      # > 0: no model, just exchange this many float32 values per step (timing)
    straggler: tuple = ()       # (worker, seconds): that worker sleeps this long every step
    die_at: tuple = ()          # (worker, step): that worker exits after computing its gradient (bad input demo)
    timeout: float = 0.0        # seconds to wait for one step's messages; 0: the cluster's KIT_TIMEOUT

    def ranks(self) -> dict[str, list[int]]:
        """Return the ranks of the servers and of the workers."""
        return {"servers": list(range(self.servers)),
                "workers": list(range(self.servers, self.servers + self.workers))}


# ----------------------------------------------------------------------------- model and data (every process)
def make_model(hidden: int = 128, seed: int = 0):
    """Build the MNIST-shaped MLP, initialised from `seed` (so every process starts from the same weights)."""
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def get_flat(model):
    """Return the model's parameters as one flat float32 vector (a copy)."""
    import torch
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def set_flat(model, flat):
    """Copy a flat vector into the model's parameters."""
    import torch
    torch.nn.utils.vector_to_parameters(flat, model.parameters())


def shards(numel: int, k: int) -> list[slice]:
    """Split 0..numel into k contiguous slices, as even as possible (server s owns slice s)."""
    edges = np.linspace(0, numel, k + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def load_train(data: str = "auto"):
    """Return the training images (float, 0..1) and labels as torch tensors."""
    import torch
    from . import datasets
    ds = datasets.load(data, verbose=False)
    return torch.from_numpy(ds.x_train).float().div_(255), torch.from_numpy(ds.y_train)


def batch_indices(step: int, batch: int, n: int, seed: int = 0):
    """Return the sample indices of global batch `step` (a fixed shuffle, read cyclically)."""
    import torch
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[(step * batch + torch.arange(batch)) % n]


def local_part(idx, worker: int, workers: int):
    """Return worker's contiguous 1/N of a global batch's indices."""
    size = len(idx) // workers
    return idx[worker * size:(worker + 1) * size]


def gradient(model, x, y):
    """Run forward and backward on (x, y); return (loss, flat gradient)."""
    import torch
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.item(), torch.cat([p.grad.reshape(-1) for p in model.parameters()])


# ----------------------------------------------------------------------------- messages (point to point)
class Link:
    """This process's end of the messages: isend/irecv that count bytes and wait no longer than a deadline."""

    def __init__(self, me: str, timeout: float, servers: int = 1):
        self.me, self.timeout, self.servers = me, timeout, servers
        self.sent = self.received = 0
        self.log: list[tuple[int, int]] = []   # (sent, received) bytes of each step

    def isend(self, tensor, dst: int):
        import torch.distributed as dist
        self.sent += tensor.numel() * tensor.element_size()
        return dist.isend(tensor, dst)

    def irecv(self, tensor, src: int | None):
        import torch.distributed as dist
        self.received += tensor.numel() * tensor.element_size()
        return dist.irecv(tensor, src)

    def wait(self, works, peers: list[str]):
        """Wait for every message; if one does not complete by the deadline, raise naming its peer."""
        deadline = time.monotonic() + self.timeout
        for work, peer in zip(works, peers):
            left = max(0.01, deadline - time.monotonic())
            try:
                work.wait(timeout=datetime.timedelta(seconds=left))
            except RuntimeError as e:
                if "Timed out" in str(e):
                    raise PeerLostError(f"{self.me}: {peer} sent nothing for {self.timeout:g} s (hung or dead)")
                raise PeerLostError(f"{self.me}: connection to {peer} closed (it died, or gave up after an error)")

    def end_step(self):
        """Record the bytes this step moved."""
        done = sum(s for s, _ in self.log), sum(r for _, r in self.log)
        self.log.append((self.sent - done[0], self.received - done[1]))


# ----------------------------------------------------------------------------- the algorithm
def push(grad, parts: list[slice], link: Link):
    """Worker: send server s its shard of the gradient (all servers at once)."""
    return [link.isend(grad[part].contiguous(), dst=s) for s, part in enumerate(parts)]


def pull(params, parts: list[slice], link: Link, sends=()):
    """Worker: receive each shard of the new parameters from its server, straight into `params`."""
    recvs = [link.irecv(params[part], src=s) for s, part in enumerate(parts)]
    names = [f"server {s} (rank {s})" for s in range(len(parts))]
    link.wait(list(sends) + recvs, names * 2 if sends else names)


def server_step(params, grads, workers: list[int], link: Link, lr: float):
    """Server (sync): receive every worker's gradient shard, average them, update, send the new shard back."""
    link.wait([link.irecv(g, src=w) for w, g in zip(workers, grads)], _names(workers, link))
    t_recv = time.perf_counter()
    average = grads[0]                                      # in place: the receive buffers are refilled each step
    for g in grads[1:]:
        average += g
    average /= len(grads)
    params.sub_(average, alpha=lr)                          # plain SGD: params -= lr * average, no temporaries
    t_update = time.perf_counter()
    link.wait([link.isend(params, dst=w) for w in workers], _names(workers, link))
    return t_recv, t_update


def server_step_async(params, grad, version: int, pulled: dict, link: Link, lr: float):
    """Server (async): take the next gradient from whichever worker pushes first, apply it, send that worker
    the new parameters; return (worker rank, staleness = updates since that worker last pulled)."""
    work = link.irecv(grad, src=None)                       # any source
    link.wait([work], ["any worker (still waiting: " + ", ".join(_names(sorted(pulled), link)) + ")"])
    w = work._source_rank()
    params.sub_(grad, alpha=lr)
    link.wait([link.isend(params, dst=w)], _names([w], link))
    staleness = version - pulled[w]
    pulled[w] = version + 1
    return w, staleness


def _names(ranks, link):
    k = link.servers
    return [f"worker {r - k} (rank {r})" for r in ranks]


# ----------------------------------------------------------------------------- one process's role
def run_engine(cfg: Config) -> dict:
    """Run this engine's part (server, worker or idle) of one parameter-server job; return its records."""
    import torch
    import torch.distributed as dist
    if not dist.is_initialized():
        raise PSError("this engine is in no torch.distributed group: call cluster.init_process_group() first")
    rank = dist.get_rank()
    ranks = cfg.ranks()
    timeout = cfg.timeout or float(os.environ.get("KIT_TIMEOUT", 60))
    role = "server" if rank in ranks["servers"] else "worker" if rank in ranks["workers"] else "idle"
    if role == "idle":
        return {"role": "idle", "rank": rank}
    me = f"server {rank} (rank {rank})" if role == "server" else f"worker {rank - cfg.servers} (rank {rank})"
    link = Link(me, timeout, cfg.servers)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    try:
        return (serve if role == "server" else work)(cfg, rank, link)
    except BaseException as e:
        failure = e
    # Distributed: close our sockets so that peers waiting on us fail now instead of at their deadline. Pending
    # messages keep the sockets open, and the traceback's frames keep them alive: drop both first.
    failure.__cause__ = failure.__context__ = None
    failure = failure.with_traceback(None)
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
    raise failure


def initial_params(cfg: Config):
    """Return the starting flat parameter vector (the seeded model's, or zeros in exchange-only mode)."""
    import torch
    if cfg.exchange_only:
        return torch.zeros(cfg.exchange_only)
    return get_flat(make_model(cfg.hidden, cfg.seed))


def serve(cfg: Config, rank: int, link: Link) -> dict:
    """Server loop: own one shard, send it to every worker, then run the steps (sync) or updates (async)."""
    import torch
    workers = cfg.ranks()["workers"]
    part = shards(initial_params(cfg).numel(), cfg.servers)[rank]
    params = initial_params(cfg)[part].clone()
    link.wait([link.isend(params, dst=w) for w in workers], _names(workers, link))   # initial pull
    link.end_step()
    rec = {"role": "server", "rank": rank, "t_recv": [], "t_update": [], "t_send": [], "staleness": [],
           "from": []}
    if cfg.mode == "sync":
        grads = [torch.empty_like(params) for _ in workers]
        for _ in range(cfg.steps):
            t0 = time.perf_counter()
            t_recv, t_update = server_step(params, grads, workers, link, cfg.lr)
            t_end = time.perf_counter()
            link.end_step()
            rec["t_recv"].append(t_recv - t0)
            rec["t_update"].append(t_update - t_recv)
            rec["t_send"].append(t_end - t_update)
    else:
        grad, pulled = torch.empty_like(params), {w: 0 for w in workers}
        for version in range(cfg.steps * len(workers)):
            w, staleness = server_step_async(params, grad, version, pulled, link, cfg.lr)
            link.end_step()
            rec["staleness"].append(staleness)
            rec["from"].append(w - cfg.servers)
    rec.update(params=params.numpy(), bytes=link.log)
    return rec


def work(cfg: Config, rank: int, link: Link) -> dict:
    """Worker loop: pull, then every step compute a gradient on its part of the batch, push it, pull."""
    import torch
    me = rank - cfg.servers
    params = initial_params(cfg)
    if cfg.exchange_only:
        model, fake = None, torch.full_like(params, 1e-3)
    else:
        model, (x, y) = make_model(cfg.hidden, cfg.seed), load_train(cfg.data)
    parts = shards(params.numel(), cfg.servers)
    pull(params, parts, link)                                # Distributed: start from the servers' parameters
    link.end_step()
    rec = {"role": "worker", "rank": rank, "loss": [], "t_compute": [], "t_comm": []}
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        if model is None:
            loss, grad = float("nan"), fake
        else:
            set_flat(model, params)
            idx = local_part(batch_indices(step, cfg.batch, len(x), cfg.seed), me, cfg.workers)
            loss, grad = gradient(model, x[idx], y[idx])
        if cfg.straggler and cfg.straggler[0] == me:
            time.sleep(cfg.straggler[1])
        if cfg.die_at and tuple(cfg.die_at) == (me, step):
            os._exit(1)                                      # bad-input demo: die mid-step, before pushing
        t1 = time.perf_counter()
        pull(params, parts, link, sends=push(grad, parts, link))   # Distributed: push, then pull
        t2 = time.perf_counter()
        link.end_step()
        rec["loss"].append(loss)
        rec["t_compute"].append(t1 - t0)
        rec["t_comm"].append(t2 - t1)
    rec["bytes"] = link.log
    return rec


# ----------------------------------------------------------------------------- the notebook side
@dataclass
class Run:
    """What one parameter-server run returned: final parameters, per-step bytes and times of every rank."""
    config: Config
    servers: list[dict]
    workers: list[dict]
    seconds: float
    params: np.ndarray = field(init=False)

    def __post_init__(self):
        self.params = np.concatenate([s["params"] for s in self.servers])

    @property
    def grad_bytes(self) -> int:
        """K: the bytes of one full gradient (float32)."""
        return self.params.size * 4

    def server_bytes(self) -> list[dict]:
        """Return, per server, the bytes in and out of each training step (the initial pull excluded)."""
        return [{"in": [r for _, r in s["bytes"][1:]], "out": [o for o, _ in s["bytes"][1:]]} for s in self.servers]

    def worker_bytes(self) -> list[dict]:
        """Return, per worker, the bytes in and out of each step."""
        return [{"in": [r for _, r in w["bytes"][1:]], "out": [o for o, _ in w["bytes"][1:]]} for w in self.workers]

    def loss(self) -> np.ndarray:
        """Return the training loss per step, averaged over the workers."""
        return np.mean([w["loss"] for w in self.workers], axis=0)

    def loss_in_update_order(self) -> np.ndarray:
        """Async: return each applied gradient's loss, in the order the server applied them."""
        seen = {w: 0 for w in range(self.config.workers)}
        out = []
        for w in self.servers[0]["from"]:
            out.append(self.workers[w]["loss"][seen[w]])
            seen[w] += 1
        return np.array(out)

    def times(self, skip: int = 2) -> dict:
        """Return median seconds per step: worker compute, worker communication, server recv/update/send."""
        med = lambda rows: float(np.median([v for r in rows for v in r[skip:]])) if rows else float("nan")  # noqa
        w, s = self.workers, self.servers
        out = {"compute": med([r["t_compute"] for r in w]), "comm": med([r["t_comm"] for r in w])}
        if self.config.mode == "sync":
            out.update({k: med([r[f"t_{k}"] for r in s]) for k in ("recv", "update", "send")})
        return out


def train(cluster, cfg: Config, wait_s: float | None = None) -> Run:
    """Run one parameter-server job on the cluster's engines (servers first); return its Run."""
    check(cfg, cluster.size)
    engines = [cluster.engine_of(r) for r in range(cfg.servers + cfg.workers)]
    t0 = time.time()
    jobs = [cluster.client[e].apply_async(run_engine, cfg) for e in engines]
    timeout = cfg.timeout or cluster.timeout
    wait_s = wait_s or (cfg.steps + 2) * timeout
    done, failed = [], {}
    for rank, job in enumerate(jobs):
        try:
            done.append(job.get(timeout=wait_s))
        except Exception as e:
            failed[rank] = e
    if failed:
        raise PSError(_explain(cluster, cfg, failed, time.time() - t0))
    return Run(cfg, [d for d in done if d["role"] == "server"], [d for d in done if d["role"] == "worker"],
               time.time() - t0)


def check(cfg: Config, engines: int):
    """Raise a clear error if the run cannot take place on `engines` engines."""
    if cfg.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {cfg.mode!r}")
    if cfg.workers < 1 or cfg.servers < 1:
        raise ValueError(f"need at least one worker and one server, got workers={cfg.workers}, "
                         f"servers={cfg.servers}")
    need = cfg.workers + cfg.servers
    if need > engines:
        raise ValueError(f"{cfg.workers} workers + {cfg.servers} server(s) need {need} engines, but the cluster has "
                         f"{engines}: start one with kit.cluster.start(n={need}) or ask for fewer workers")
    if cfg.mode == "async" and cfg.servers != 1:
        raise ValueError("async mode is implemented for one server (servers=1)")
    if cfg.batch % cfg.workers:
        raise ValueError(f"batch {cfg.batch} does not split evenly over {cfg.workers} workers")


def _explain(cluster, cfg, failed: dict, seconds: float) -> str:
    dead = cluster.poll_dead()
    lines = [f"parameter-server run failed after {seconds:.1f} s:"]
    for rank, e in sorted(failed.items()):
        who = f"server {rank}" if rank < cfg.servers else f"worker {rank - cfg.servers}"
        if rank in dead:
            lines.append(f"  {who} (rank {rank}) DIED: {dead[rank]}")
        else:
            msg = getattr(e, "evalue", None) or str(e)
            lines.append(f"  {who} (rank {rank}) raised {getattr(e, 'ename', type(e).__name__)}: {msg}")
    if dead:
        lines.append("the job is broken: cluster.restart() then cluster.init_process_group() for a fresh one")
    else:
        lines.append("cluster.init_process_group() gives the engines a fresh process group")
    return "\n".join(lines)


def train_single(cfg: Config) -> tuple[np.ndarray, list[float]]:
    """Reference: plain single-process SGD on the whole global batch; return (flat parameters, losses)."""
    model, (x, y) = make_model(cfg.hidden, cfg.seed), load_train(cfg.data)
    params, losses = get_flat(model), []
    for step in range(cfg.steps):
        set_flat(model, params)
        loss, grad = gradient(model, *(t[batch_indices(step, cfg.batch, len(x), cfg.seed)] for t in (x, y)))
        params -= cfg.lr * grad
        losses.append(loss)
    return params.numpy(), losses


def accuracy(params: np.ndarray, cfg: Config) -> float:
    """Return the test accuracy of flat parameters `params` for cfg's model."""
    import torch
    from . import datasets
    ds = datasets.load(cfg.data, verbose=False)
    model = make_model(cfg.hidden, cfg.seed)
    set_flat(model, torch.from_numpy(params))
    with torch.no_grad():
        pred = model(torch.from_numpy(ds.x_test).float() / 255).argmax(1).numpy()
    return float((pred == ds.y_test).mean())


# ----------------------------------------------------------------------------- alpha-beta cost model
def pingpong(sizes: list[int], repeats: int, timeout: float = 60.0, pin: bool = True) -> dict | None:
    """Ranks 0 and 1 bounce messages of each size (bytes); rank 0 returns {size: median one-way seconds}.
    pin: each of the two runs on a core of its own while it measures (as MPI benchmarks bind their processes);
    left to the scheduler, the two sometimes share a core and B varies 2.5-4 GB/s from run to run here."""
    import torch
    import torch.distributed as dist
    from .sysinfo import pin_threads
    rank = dist.get_rank()
    if rank > 1:
        return None
    cores = sorted(os.sched_getaffinity(0))
    before = pin_threads({cores[rank % len(cores)]}) if pin else None
    link, peer = Link(f"rank {rank}", timeout), 1 - rank
    out = {}
    try:
        for size in sizes:
            buf, rounds = torch.zeros(max(1, size // 4)), []
            for i in range(repeats + 2):                         # 2 warm-up rounds
                t0 = time.perf_counter()
                if rank == 0:
                    link.wait([link.isend(buf, peer)], ["rank 1"])
                    link.wait([link.irecv(buf, peer)], ["rank 1"])
                else:
                    link.wait([link.irecv(buf, peer)], ["rank 0"])
                    link.wait([link.isend(buf, peer)], ["rank 0"])
                rounds.append((time.perf_counter() - t0) / 2)
            out[buf.numel() * 4] = float(np.median(rounds[2:]))   # the median is robust to a busy machine
    finally:
        if before is not None:
            pin_threads(before)
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
    for i in range(repeats + 2):
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


def fit_alpha_beta(sizes, seconds, large: int = 1 << 20) -> tuple[float, float]:
    """Fit t = alpha + size / B: alpha from the smallest message, B by least squares over messages >= `large`
    bytes (gradients are large; small messages sit in caches and would flatter B); return (alpha s, B bytes/s)."""
    sizes, seconds = np.asarray(sizes, float), np.asarray(seconds, float)
    alpha = float(seconds[np.argmin(sizes)])
    big = sizes >= min(large, sizes.max())
    extra = np.maximum(seconds[big] - alpha, 1e-12)
    return alpha, float(np.sum(sizes[big] ** 2) / np.sum(sizes[big] * extra))


DEFAULT_SIZES = [4, 1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]


def measure_alpha_beta(cluster, sizes=DEFAULT_SIZES, repeats: int = 20, pin: bool = True, rounds: int = 3) -> dict:
    """Ping-pong between engines 0 and 1 (torch.distributed, gloo), each pinned to a core of its own unless
    pin=False, and the host's rate with every engine busy (`fan`, 1 and 2 hubs: the max-rate model's B_max).
    Each is measured `rounds` times, interleaved, and the median taken: single runs vary by 10-20% here.
    Return alpha, B, B_max {hubs: bytes/s} and the ping-pong's median seconds per size."""
    if cluster.size < 2:
        raise ValueError("ping-pong needs at least 2 engines")
    hubs = [h for h in (1, 2) if cluster.size >= h + 2]
    times, fans = [], {h: [] for h in hubs}
    for _ in range(rounds):
        res = cluster.wait(cluster.view.apply_async(pingpong, list(sizes), repeats, cluster.timeout, pin))[0]
        times.append(list(res.values()))
        for h in hubs:
            fans[h].append(cluster.wait(cluster.view.apply_async(fan, FAN_SIZE, repeats, h, cluster.timeout))[0])
    seconds = [float(t) for t in np.median(times, axis=0)]
    alpha, bw = fit_alpha_beta(list(res), seconds)
    return {"alpha": alpha, "B": bw, "sizes": list(res), "seconds": seconds,
            "B_max": {h: float(np.median(f)) for h, f in fans.items()}}


FAN_SIZE = 8 << 20      # bytes per spoke in the saturation test (between the exchanges' 4 and 16 MB)


def t_comm_ps(N, K, alpha, B, k: int = 1):
    """Predict one PS step's communication time: 2 (alpha + N K / (k B)) -- push in, pull out, k shards."""
    return 2 * (alpha + np.asarray(N) * K / (k * B))


def t_comm_one_host(N, K, B, t_empty, B_max=None):
    """Predict one PS step's communication time when servers and workers share one host: the measured time of an
    empty exchange (latency and scheduling, see `empty_exchange`) plus 2 N K / B_eff, every byte going in and out
    through the host whatever the number of servers. One stream moves B; N streams at once move at most N B and
    at most the host's B_max (the max-rate model, Gropp, Olson & Samfass, EuroMPI 2016): B_eff = min(B_max, N B)."""
    N = np.asarray(N)
    B_eff = B if B_max is None else np.minimum(B_max, B * N)
    return t_empty + 2 * N * K / B_eff


def exchange(cluster, workers: int, servers: int, floats: int, steps: int = 30, runs: int = 1, **model) -> dict:
    """Time a pure exchange (no model, no compute) of `floats` float32 values per worker, `runs` times; return the
    summary row (`summarise(run, **model)`) of the median run (of two, the faster): the scheduler sometimes keeps
    two busy processes on one core for a whole run. floats=1 is the empty exchange: the per-step latency of this
    pattern here."""
    cfg = Config(workers=workers, servers=servers, steps=steps, exchange_only=floats)
    rows = sorted((summarise(train(cluster, cfg), **model) for _ in range(runs)), key=lambda r: r["measured_ms"])
    return rows[(runs - 1) // 2]


def empty_exchange(cluster, workers: int, servers: int, runs: int = 3, steps: int = 50) -> float:
    """Return the seconds of one empty exchange (one float) of this pattern, the median of `runs` runs."""
    return exchange(cluster, workers, servers, 1, steps, runs)["measured_ms"] / 1e3


# ----------------------------------------------------------------------------- plots
def plot_parallelism(ax=None):
    """Draw model parallelism (layers split over devices) next to data parallelism (batch split, replicas)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle
    if ax is None:
        _, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    colors = ["tab:blue", "tab:orange", "tab:green"]

    def box(a, x, y, w, h, text, color, alpha=0.35):
        a.add_patch(Rectangle((x, y), w, h, color=color, alpha=alpha))
        a.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8)

    def arrow(a, p, q, color="k"):
        a.add_patch(FancyArrowPatch(p, q, arrowstyle="->", mutation_scale=10, color=color))

    a = ax[0]
    a.set_title("model parallelism: one batch, layers split")
    box(a, 0.05, 0.4, 0.12, 0.2, "batch", "grey")
    for d in range(3):
        box(a, 0.25 + d * 0.25, 0.3, 0.18, 0.4, f"layers {2 * d + 1}-{2 * d + 2}\ndevice {d}", colors[d])
        arrow(a, (0.17 + d * 0.25 + (0.01 if d else 0), 0.5), (0.25 + d * 0.25, 0.5))
    a.text(0.5, 0.12, "activations flow device to device", ha="center", fontsize=8)
    a = ax[1]
    a.set_title("data parallelism: batch split, model copied")
    box(a, 0.36, 0.82, 0.28, 0.14, "parameter server\n(average, update)", "tab:red")
    for d in range(3):
        x = 0.05 + d * 0.33
        box(a, x, 0.05, 0.22, 0.12, f"batch 1/{3} #{d}", "grey")
        box(a, x, 0.3, 0.22, 0.25, f"full model\nworker {d}", colors[d])
        arrow(a, (x + 0.11, 0.17), (x + 0.11, 0.3))
        arrow(a, (x + 0.07, 0.55), (0.42 + 0.04 * d, 0.82), "tab:red")
        arrow(a, (0.5 + 0.04 * (d - 1), 0.82), (x + 0.15, 0.55), "tab:blue")
    a.text(1.0, 0.72, "push gradients", ha="right", fontsize=8, color="tab:red")
    a.text(1.0, 0.65, "pull parameters", ha="right", fontsize=8, color="tab:blue")
    for a in ax:
        a.set_xlim(0, 1), a.set_ylim(0, 1), a.axis("off")
    return ax


def plot_bytes(rows: list[dict], K: int, ax=None):
    """Plot measured bytes per step at one server against N, with the N*K/k line; rows from `summarise`."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(5, 3.5))[1]
    for k in sorted({r["k"] for r in rows}):
        rs = [r for r in rows if r["k"] == k]
        ns = [r["N"] for r in rs]
        ax.plot(ns, [r["server_in"] / 1e6 for r in rs], "o", ms=8, label=f"measured in, k={k}")
        ax.plot(ns, [r["server_out"] / 1e6 for r in rs], "x", ms=8, label=f"measured out, k={k}")
        ax.plot(ns, [n * K / k / 1e6 for n in ns], "-", lw=1, label=f"N K / k, k={k}")
    ax.set_xlabel("workers N"), ax.set_ylabel("MB per step at one server"), ax.legend(fontsize=7)
    return ax


def plot_split(rows: list[dict], ax=None, title="step time"):
    """Plot worker step time split into compute and communication against N (one bar group per k)."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(5, 3.5))[1]
    labels = [f"N={r['N']}\nk={r['k']}" for r in rows]
    comp = np.array([r["compute_ms"] for r in rows])
    comm = np.array([r["comm_ms"] for r in rows])
    ax.bar(labels, comp, label="compute")
    ax.bar(labels, comm, bottom=comp, label="communication (push + wait + pull)")
    ax.set_ylabel("ms per step (median)"), ax.set_title(title), ax.legend(fontsize=7)
    return ax


def plot_model(ab: dict, rows: list[dict], ax=None):
    """Plot ping-pong timings with the alpha-beta fit, and predicted vs measured server exchange time."""
    import matplotlib.pyplot as plt
    ax = ax if ax is not None else plt.subplots(1, 2, figsize=(10, 3.6))[1]
    s = np.array(ab["sizes"], float)
    ax[0].loglog(s, np.array(ab["seconds"]) * 1e3, "o", label="ping-pong (one way)")
    ax[0].loglog(s, (ab["alpha"] + s / ab["B"]) * 1e3, "-", label="alpha + size / B")
    ax[0].set_xlabel("message bytes"), ax[0].set_ylabel("ms"), ax[0].legend(fontsize=7)
    ax[0].set_title(f"alpha = {ab['alpha'] * 1e6:.0f} us, B = {ab['B'] / 1e9:.2f} GB/s")
    pred = np.array([r["predicted_ms"] for r in rows])
    meas = np.array([r["measured_ms"] for r in rows])
    ax[1].loglog(pred, meas, "o")
    for r, p, m in zip(rows, pred, meas):
        ax[1].annotate(f"N{r['N']} k{r['k']} {r['K'] / 1e6:.1f}MB", (p, m), fontsize=6)
    lim = [min(pred.min(), meas.min()) * 0.7, max(pred.max(), meas.max()) * 1.4]
    ax[1].plot(lim, lim, "k--", lw=1, label="measured = predicted")
    ax[1].fill_between(lim, [v * 0.75 for v in lim], [v * 1.25 for v in lim], color="grey", alpha=0.2,
                       label="within 25%")
    ax[1].set_xlabel("predicted t_empty + 2 N K / min(B_max, N B), ms")
    ax[1].set_ylabel("measured at the workers, ms")
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
    for axis in (ax[1].xaxis, ax[1].yaxis):                 # ticks at 1, 2, 5, 10, 20, ... ms, plainly written
        axis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        axis.set_major_formatter(ScalarFormatter()), axis.set_minor_formatter(NullFormatter())
    if ab.get("B_max"):
        ax[1].set_title("B_max = " + " / ".join(f"{b / 1e9:.2f}" for b in ab["B_max"].values()) + " GB/s ("
                        + " / ".join(str(h) for h in ab["B_max"]) + " servers)")
    ax[1].legend(fontsize=7)
    return ax


def plot_extrapolation(alpha: float, B: float, K: float, ns, ks=(1, 8, 64), compute_s: float | None = None,
                       ax=None):
    """Plot predicted PS communication time per step against N for k servers."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(5.5, 3.8))[1]
    ns = np.asarray(ns)
    for k in ks:
        ax.loglog(ns, t_comm_ps(ns, K, alpha, B, k), "o-", label=f"PS, k={k} server(s)")
    if compute_s:
        ax.axhline(compute_s, color="k", ls="--", lw=1, label=f"compute per step ({compute_s:g} s)")
    ax.set_xlabel("workers N"), ax.set_ylabel("seconds per step (communication)")
    ax.set_title(f"K = {K / 1e6:.0f} MB, B = {B * 8 / 1e9:.0f} Gbit/s"), ax.legend(fontsize=7)
    return ax


# ----------------------------------------------------------------------------- summaries and the benchmark
def summarise(run: Run, alpha: float | None = None, B: float | None = None, t_empty: float | None = None,
              B_max: float | None = None) -> dict:
    """Return one table row: N, k, K, exact bytes per step at each server and worker, times, the predictions.

    With alpha and B: `predicted_k_links_ms` is the textbook 2(alpha + N K / (k B)) (each server on its own link);
    `predicted_one_host_ms` is 2(alpha + N K / B) (the k servers share this host). With t_empty (seconds, from
    `empty_exchange`) and B_max: `predicted_ms` = t_empty + 2 N K / min(B_max, N B) (`t_comm_one_host`), the
    model for one host; `error` = measured / predicted - 1."""
    cfg, sb, wb = run.config, run.server_bytes(), run.worker_bytes()
    one = lambda xs: xs[0] if len(set(xs)) == 1 else None  # noqa: E731  the same every step, or None
    t = run.times()
    row = {"N": cfg.workers, "k": cfg.servers, "mode": cfg.mode, "K": run.grad_bytes,
           "server_in": one(sb[0]["in"]), "server_out": one(sb[0]["out"]),
           "servers_in": [one(s["in"]) for s in sb], "servers_out": [one(s["out"]) for s in sb],
           "worker_in": one(wb[0]["in"]), "worker_out": one(wb[0]["out"]),
           "compute_ms": 1e3 * t["compute"], "comm_ms": 1e3 * t["comm"]}
    shard = [int(p.size) * 4 for p in (s["params"] for s in run.servers)]
    row["bytes_exact"] = all(one(s["in"]) == one(s["out"]) == cfg.workers * b for s, b in zip(sb, shard)) and \
        sum(shard) == run.grad_bytes and all(one(w["in"]) == one(w["out"]) == run.grad_bytes for w in wb)
    if cfg.mode == "sync":
        row["server_ms"] = 1e3 * (t["recv"] + t["send"])     # the server's own view (misses what overlapped)
        row["update_ms"] = 1e3 * t["update"]
        # A worker's push + pull, less the server's arithmetic: the time messages took, as the worker sees it.
        row["exchange_ms"] = row["comm_ms"] - row["update_ms"]
    row["measured_ms"] = row.get("exchange_ms", row["comm_ms"])
    if alpha is not None:
        N, K = cfg.workers, run.grad_bytes
        row["predicted_k_links_ms"] = 1e3 * float(t_comm_ps(N, K, alpha, B, cfg.servers))
        row["predicted_one_host_ms"] = 1e3 * float(t_comm_ps(N, K, alpha, B, 1))
        row["predicted_ms"] = row["predicted_one_host_ms"]
        if t_empty is not None:
            row["empty_ms"] = 1e3 * t_empty
            row["predicted_ms"] = 1e3 * float(t_comm_one_host(N, K, B, t_empty, B_max))
        row["error"] = row["measured_ms"] / row["predicted_ms"] - 1
    return row


def bench(out_dir, quick: bool = False):
    """Measure PS bytes, times and the alpha-beta model on 5 engines; write ps*.png; return (result, summary)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from . import cluster as kc
    engines = 5
    steps = 8 if quick else 40
    with kc.start(n=engines, quiet=True) as c:
        c.init_process_group()
        exchange(c, engines - 1, 1, 4 << 20, 5)      # warm-up: first big messages pay for buffers and page faults
        ab = measure_alpha_beta(c, repeats=3 if quick else 20, rounds=1 if quick else 3)
        train_rows, model_rows = [], []
        for k in (1, 2):
            for n in range(1, engines - k + 1):
                t_empty = empty_exchange(c, n, k)
                cfg = Config(workers=n, servers=k, steps=steps, batch=120)
                train_rows.append(summarise(train(c, cfg), ab["alpha"], ab["B"], t_empty, ab["B_max"][k]))
                for floats in [1 << 20] + ([] if quick else [4 << 20]):   # 4 MB and 16 MB exchanges
                    model_rows.append(exchange(c, n, k, floats, steps, runs=3, alpha=ab["alpha"], B=ab["B"],
                                               t_empty=t_empty, B_max=ab["B_max"][k]))
    K = train_rows[0]["K"]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    plot_bytes(train_rows, K, ax[0])
    plot_split(train_rows, ax[1], title=f"MLP step time ({engines} engines on {os.cpu_count()} cores: "
                                        "oversubscribed)")
    fig.tight_layout(), fig.savefig(out_dir / "ps.png", dpi=100), plt.close(fig)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    plot_model(ab, model_rows, ax)
    fig.tight_layout(), fig.savefig(out_dir / "ps_model.png", dpi=100), plt.close(fig)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    plot_extrapolation(ab["alpha"], 25e9 / 8, 100e6, [8, 16, 32, 64, 128, 256, 512], ax=ax)
    fig.tight_layout(), fig.savefig(out_dir / "ps_extrapolation.png", dpi=100), plt.close(fig)
    errors = [abs(r["error"]) for r in model_rows]
    plain = [abs(r["measured_ms"] / r["predicted_one_host_ms"] - 1) for r in model_rows]
    within = sum(e <= 0.25 for e in errors)
    exact = all(r["bytes_exact"] for r in train_rows + model_rows)
    big = max(model_rows, key=lambda r: (r["K"], r["N"], -r["k"]))
    summary = (f"ps: alpha={ab['alpha'] * 1e6:.0f} us B={ab['B'] / 1e9:.2f} GB/s B_max={ab['B_max'][1] / 1e9:.2f} "
               f"(1 server), {ab['B_max'][2] / 1e9:.2f} (2) GB/s; server bytes/step == N*K/k exactly: {exact} "
               f"(MLP K={K} B); prediction t_empty + 2NK/min(B_max, NB) within 25% for {within}/{len(errors)} "
               f"exchanges (median |error| {np.median(errors):.0%}; the plain 2(alpha + NK/B): "
               f"{sum(e <= 0.25 for e in plain)}/{len(plain)}; N={big['N']} k={big['k']} K={big['K'] / 1e6:.0f} MB: "
               f"{big['measured_ms']:.0f} ms measured vs {big['predicted_ms']:.0f} predicted); {engines} engines on "
               f"{os.cpu_count()} cores (times oversubscribed)")
    result = {"alpha_s": ab["alpha"], "B_bytes_per_s": ab["B"], "pingpong": ab, "training": train_rows,
              "exchange": model_rows, "bytes_exact": exact, "within_25pct": [within, len(errors)],
              "within_25pct_without_t_empty": [sum(e <= 0.25 for e in plain), len(plain)]}
    return result, summary
