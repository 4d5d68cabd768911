"""A parameter server on real processes: workers push gradients, servers average and update, workers pull.

    cluster = kit.cluster.start(n=N + k); cluster.init_process_group()
    run = kit.comm.ps.train(cluster, kit.comm.ps.Config(workers=N, servers=k, mode="sync"))
    run.params, run.server_bytes(), run.times()

Ranks 0..k-1 are servers (server s owns shard s of the flat parameter vector); ranks k..k+N-1 are workers.
Every tensor travels as a torch.distributed message over `kit.comm.link.Link`, which counts the bytes it moves.
The algorithm is `push`, `pull`, `server_step` and `server_step_async`; the rest is plumbing (`train(...,
algorithm={"push": f, ...})` runs a reader's own versions, as notebook 02 does). The cost model is
`kit.comm.costmodel`, the measurements behind notebook 02's tables `kit.comm.ps_measure`.
"""
from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field

import numpy as np

from kit.comm.link import Link, PeerLostError  # noqa: F401  (PeerLostError: what a lost peer raises on an engine)
from kit.comm.mlp import accuracy, batch_indices, get_flat, gradient, load_train, local_part, make_model, set_flat, \
    train_single  # noqa: F401  (accuracy, train_single: the notebook's reference)

MODES = ("sync", "async")
ALGORITHM = ("push", "pull", "server_step", "push_async", "server_step_async")   # what `train(...,
# algorithm=...)` may replace (notebook 02 does)


class PSError(RuntimeError):
    """A parameter-server run failed; the message says which rank did what."""


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


def shards(numel: int, k: int) -> list[slice]:
    """Split 0..numel into k contiguous slices, as even as possible (server s owns slice s)."""
    edges = np.linspace(0, numel, k + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]



# ----------------------------------------------------------------------------- the algorithm
def push(grad, parts: list[slice], link: Link):
    """Worker: send server s its shard of the gradient (all servers at once)."""
    return [link.isend(grad[part], dst=s) for s, part in enumerate(parts)]


def pull(params, parts: list[slice], link: Link, sends=()):
    """Worker: receive each shard of the new parameters from its server, straight into `params`; wait for the
    pushes `sends` too."""
    recvs = [link.irecv(params[part], src=s) for s, part in enumerate(parts)]
    link.wait(list(sends) + recvs, "a server" if len(parts) > 1 else "server 0 (rank 0)")


def server_step(params, grads, workers: list[int], link: Link, lr: float):
    """Server (sync): receive every worker's gradient shard, average them, update, send the new shard back."""
    link.wait([link.irecv(g, src=w) for w, g in zip(workers, grads)], _names(workers))
    t_recv = time.perf_counter()
    average = grads[0]                                      # in place: the receive buffers are refilled each step
    for g in grads[1:]:
        average += g
    average /= len(grads)
    params.sub_(average, alpha=lr)                          # plain SGD: params -= lr * average, no temporaries
    t_update = time.perf_counter()
    link.wait([link.isend(params, dst=w) for w in workers], _names(workers))
    return t_recv, t_update


def push_async(grad, rank: int, link: Link):
    """Worker (async, one server): send who is pushing (a 4-byte header), then the gradient."""
    import torch
    return [link.isend(torch.tensor([rank], dtype=torch.int32), dst=0), link.isend(grad, dst=0)]


def server_step_async(params, grad, version: int, pulled: dict, link: Link, lr: float):
    """Server (async): take the next gradient from whichever worker pushes first, apply it, send that worker
    the new parameters; return (worker rank, staleness = updates since that worker last pulled)."""
    import torch
    who = torch.empty(1, dtype=torch.int32)
    link.wait([link.irecv(who, src=None)], "any worker (waiting on " + ", ".join(_names(sorted(pulled))) + ")")
    w = int(who)                                            # its gradient is its next message to us
    link.wait([link.irecv(grad, src=w)], _names([w]))
    params.sub_(grad, alpha=lr)
    link.wait([link.isend(params, dst=w)], _names([w]))
    staleness = version - pulled[w]
    pulled[w] = version + 1
    return w, staleness


def _names(ranks):
    return [f"the worker at rank {r}" for r in ranks]


# ----------------------------------------------------------------------------- one process's role
def run_engine(cfg: Config, algorithm: dict | None = None) -> dict:
    """Run this engine's part (server, worker or idle) of one parameter-server job; return its records.
    `algorithm` maps names in ALGORITHM to functions that replace this module's (same signatures)."""
    import torch
    import torch.distributed as dist
    if not dist.is_initialized():
        raise PSError("this engine is in no torch.distributed group: call cluster.init_process_group() first")
    rank = dist.get_rank()
    ranks = cfg.ranks()
    role = "server" if rank in ranks["servers"] else "worker" if rank in ranks["workers"] else "idle"
    if role == "idle":
        return {"role": "idle", "rank": rank}
    me = f"server {rank} (rank {rank})" if role == "server" else f"worker {rank - cfg.servers} (rank {rank})"
    link = Link(me, cfg.timeout or None)         # None: the cluster's KIT_TIMEOUT
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    try:
        return (serve if role == "server" else work)(cfg, rank, link, algorithm_with(algorithm))
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


def algorithm_with(given: dict | None) -> dict:
    """Return this module's parts of the algorithm (ALGORITHM), with those in `given` put in their place."""
    unknown = sorted(set(given or ()) - set(ALGORITHM))
    if unknown:
        raise ValueError(f"algorithm: {unknown} are not parts of the algorithm; give some of {list(ALGORITHM)}")
    return {name: (given or {}).get(name) or globals()[name] for name in ALGORITHM}


def initial_params(cfg: Config):
    """Return the starting flat parameter vector (the seeded model's, or zeros in exchange-only mode)."""
    import torch
    if cfg.exchange_only:
        return torch.zeros(cfg.exchange_only)
    return get_flat(make_model(cfg.hidden, cfg.seed))


def serve(cfg: Config, rank: int, link: Link, algo: dict) -> dict:
    """Server loop: own one shard, send it to every worker, then run the steps (sync) or updates (async)."""
    import torch
    workers = cfg.ranks()["workers"]
    part = shards(initial_params(cfg).numel(), cfg.servers)[rank]
    params = initial_params(cfg)[part].clone()
    link.wait([link.isend(params, dst=w) for w in workers], _names(workers))   # initial pull
    link.end_step()
    rec = {"role": "server", "rank": rank, "t_recv": [], "t_update": [], "t_send": [], "staleness": [],
           "from": []}
    if cfg.mode == "sync":
        grads = [torch.empty_like(params) for _ in workers]
        for _ in range(cfg.steps):
            t0 = time.perf_counter()
            t_recv, t_update = algo["server_step"](params, grads, workers, link, cfg.lr)
            t_end = time.perf_counter()
            link.end_step()
            rec["t_recv"].append(t_recv - t0)
            rec["t_update"].append(t_update - t_recv)
            rec["t_send"].append(t_end - t_update)
    else:
        grad, pulled = torch.empty_like(params), {w: 0 for w in workers}
        for version in range(cfg.steps * len(workers)):
            w, staleness = algo["server_step_async"](params, grad, version, pulled, link, cfg.lr)
            link.end_step()
            rec["staleness"].append(staleness)
            rec["from"].append(w - cfg.servers)
    rec.update(params=params.numpy(), bytes=link.log)
    return rec


def work(cfg: Config, rank: int, link: Link, algo: dict) -> dict:
    """Worker loop: pull, then every step compute a gradient on its part of the batch, push it, pull."""
    import torch
    me = rank - cfg.servers
    params = initial_params(cfg)
    if cfg.exchange_only:
        model, fake = None, torch.full_like(params, 1e-3)
    else:
        model, (x, y) = make_model(cfg.hidden, cfg.seed), load_train(cfg.data)
    parts = shards(params.numel(), cfg.servers)
    algo["pull"](params, parts, link)                        # Distributed: start from the servers' parameters
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
        sends = algo["push"](grad, parts, link) if cfg.mode == "sync" else algo["push_async"](grad, rank, link)
        algo["pull"](params, parts, link, sends)             # Distributed: push, then pull
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


def train(cluster, cfg: Config, wait_s: float | None = None, algorithm: dict | None = None) -> Run:
    """Run one parameter-server job on the cluster's engines (servers first); return its Run. `algorithm`:
    {"push": f, "pull": f, "server_step": f}, any of them, to run instead of this module's (notebook 02 passes
    the ones its reader edits; ipyparallel ships a notebook's functions to the engines)."""
    check(cfg, cluster.size)
    algorithm_with(algorithm)                   # a clear error here, not on every engine
    engines = [cluster.engine_of(r) for r in range(cfg.servers + cfg.workers)]
    t0 = time.time()
    jobs = [cluster.client[e].apply_async(run_engine, cfg, dict(algorithm or {})) for e in engines]
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

