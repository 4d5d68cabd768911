"""The ring and the parameter server where the network is the bottleneck: one experiment on emulated hosts.

    x = experiment(ns=(2, 4), sizes=(4 << 10, 64 << 20), rate="1gbit")
    x["link"]       # alpha and B from ping-pongs between h1 and h2 (median of rounds, with their min-max), the
                    # link's own latency with bare sockets (socket_alpha), stream
    x["latency"]    # how the messages' latency is paid: the PS's alpha and per-message overhead o, the ring's
    x["rows"]       # one per (N, implementation, K): seconds, busbw, bytes each host sent/received, the model

One lab of max(ns) + 1 hosts (`kit.netlab`) serves every N, so every N of a comparison has the same links and
the same alpha and B, measured once. For each N: one engine on each of h1..hN (`kit.cluster`, gloo), and
  ring     the kit's ring (`kit.comm.ring.allreduce`): 2(N-1) messages in sequence
  byteps   k = N servers placed on the workers: rank r serves shard r (`kit.comm.byteps.allreduce_colocated`)
  torch    torch.distributed's all_reduce (gloo)
  horovod  Horovod over Gloo (`hvd.allreduce_`)
  horovod_mpi  Horovod over MPI: a second job on the same hosts, started by mpiexec over the lab's SSH
  ps       one parameter server with a host of its own, h(N+1), running `kit.comm.ps.server_step`; the N engines
           push and pull with `kit.comm.ps.push` / `kit.comm.ps.pull`
alpha and B come from a ping-pong on the lab's link (never fitted to allreduce points); the PS's per-message
overhead o from its smallest-K steps against N (`kit.comm.costmodel.fit_latency`). The bytes each host put on
the wire come from its NIC's counters (`kit.netlab.counters`), counted around the timed calls and divided by
their number: what the model's 2(N-1)/N·K and N·K are compared with.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types

import numpy as np

from kit import env as kit_env
from kit.comm.byteps import allreduce_colocated
from kit.comm.costmodel import busbw, fit_alpha_beta, fit_latency, pingpong, predict, ring_bytes, t_comm_ps
from kit.netlab import rate as netlab_rate
from kit.netlab.counters import counters, payload
from kit.netlab.lab import start as start_lab
from kit.netlab.system import parse_rate

IMPLS = ("ring", "byteps", "torch", "horovod", "horovod_mpi", "ps")
SCHEME = {"ps": "ps", "byteps": "colocated"}      # the model of each implementation; the others are rings
# What the NIC counters may add to the payload (the "TCP/IP overhead"): each 1448-byte TCP segment (MTU 1500)
# carries 66 bytes of Ethernet, IP and TCP headers (timestamps on), and the data coming the other way is
# acknowledged by 66-byte ACKs, at worst one per segment. The veths pass 64 KB GSO packets counted with ONE
# header each, so data headers usually cost far less; the ACKs of the opposite direction remain (a PS worker
# pulls K while it sends K: its counters show up to 66/1448 of K in ACKs).
TCP_OVERHEAD_BOUND = 2 * 66 / 1448
PINGPONG_SMALL, PINGPONG_LARGE = [4, 4 << 10], [1 << 20, 4 << 20, 16 << 20]   # for alpha (many repeats), for B
SMALL, SMALL_REPS = 64 << 10, 30   # messages up to SMALL bytes are latency-bound and noisy: time them SMALL_REPS times
KIT_ROOT = kit_env.KIT_ROOT      # holds `kit`


# ----------------------------------------------------------------------------------- on every engine (and server)
def reps_for(nbytes: int, reps: int) -> int:
    """Return the timed calls for a message of `nbytes`: `reps`, or SMALL_REPS for a latency-bound one."""
    return max(reps, SMALL_REPS) if nbytes <= SMALL else reps


def _runner(impl: str, link):
    if impl == "ring":
        from kit.comm.ring import allreduce
        return lambda t, i: allreduce(t, check=False)
    if impl == "byteps":
        return lambda t, i: allreduce_colocated(t, link)
    if impl == "torch":
        import torch.distributed as dist
        return lambda t, i: dist.all_reduce(t)
    if impl in ("horovod", "horovod_mpi"):                # the cluster's backend decides which
        import horovod.torch as hvd
        return lambda t, i: hvd.allreduce_(t, op=hvd.Sum, name=f"netbench.{i}")
    raise ValueError(f"unknown implementation {impl!r}: use one of {IMPLS[:-1]} (ps runs with its own server)")


def engine_time(impl: str, nbytes: int, reps: int) -> dict:
    """Allreduce `nbytes` of float32 ones `reps` times (after one untimed call) with `impl`; return this rank's
    seconds per call, whether every sum was right, and its NIC's bytes per call (counted around the timed calls)."""
    import torch
    import torch.distributed as dist
    from kit.comm.link import Link
    size = dist.get_world_size()
    y = torch.ones(nbytes // 4)
    run = _runner(impl, Link(f"rank {dist.get_rank()}"))
    run(y, -1)
    ok, seconds = bool((y == size).all()), []
    dist.barrier()
    c0 = counters()
    for i in range(reps):
        y.fill_(1.0)
        dist.barrier()
        t0 = time.perf_counter()
        run(y, i)
        seconds.append(time.perf_counter() - t0)
        ok = ok and bool((y == size).all())
    dist.barrier()
    c1 = counters()
    return {"seconds": seconds, "ok": ok, **{k: (c1[k] - c0[k]) / reps for k in c0}}


def _join(init_method: str, rank: int, size: int, timeout: float):
    import datetime
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout))


def ps_role(server: bool, sizes, reps: int, timeout: float) -> list[dict]:
    """Run this rank's side of a one-server PS exchange (rank 0 serves, ranks 1..N work) for each size, reps
    times after one untimed step; return per size the seconds per step (workers), the NIC's bytes per step, ok."""
    import torch
    import torch.distributed as dist
    from kit.comm.link import Link
    from kit.comm.ps import pull, push, server_step
    rank, size = dist.get_rank(), dist.get_world_size()
    link, workers, out = Link(f"rank {rank}", timeout), list(range(1, size)), []
    for nbytes in sizes:
        n, reps_k = nbytes // 4, reps_for(nbytes, reps)
        params, grad, parts = torch.zeros(n), torch.ones(n), [slice(0, n)]
        grads = [torch.empty(n) for _ in workers] if server else None
        seconds, c0 = [], None
        for step in range(reps_k + 1):             # step 0: untimed warm-up
            if step == 1:
                dist.barrier()
                c0 = counters()
            dist.barrier()
            t0 = time.perf_counter()
            if server:
                server_step(params, grads, workers, link, lr=1.0)     # params -= mean of the gradients (= 1)
            else:
                pull(params, parts, link, push(grad, parts, link))
            seconds += [time.perf_counter() - t0] if step else []
        dist.barrier()
        c1 = counters()
        ok = bool((params == -(reps_k + 1)).all())
        out.append({"bytes": nbytes, "seconds": seconds, "ok": ok, **{k: (c1[k] - c0[k]) / reps_k for k in c0}})
    return out


def engine_ps_worker(init_method: str, sizes, reps: int, timeout: float) -> list[dict]:
    """Leave the N-rank group, join the server's (rank = kit rank + 1), work; return `ps_role`'s records."""
    import torch.distributed as dist
    _join(init_method, int(os.environ["KIT_RANK"]) + 1, int(os.environ["KIT_SIZE"]) + 1, timeout)
    try:
        return ps_role(False, sizes, reps, timeout)
    finally:
        dist.destroy_process_group()


def serve_main(argv):
    """`python -m kit.netlab.exchange serve ADDR WORLD SIZES REPS TIMEOUT`: the PS server process on its own host.
    Prints its store's port, then one JSON line of `ps_role` records."""
    import datetime
    import torch.distributed as dist
    addr, world, sizes, reps, timeout = argv[0], int(argv[1]), json.loads(argv[2]), int(argv[3]), float(argv[4])
    store = dist.TCPStore(addr, 0, world, is_master=True, timeout=datetime.timedelta(seconds=timeout),
                          wait_for_workers=False)
    print(store.port, flush=True)
    store_pg = dist.PrefixStore("default_pg", store)     # what init_method="tcp://..." adds on the workers' side
    dist.init_process_group("gloo", store=store_pg, rank=0, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        print(json.dumps(ps_role(True, sizes, reps, timeout)), flush=True)
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------- the notebook side
def _hosts(lab, n: int):
    """Return a view of `lab` with only its first n hosts (kit.cluster puts one engine on each host it is given)."""
    return types.SimpleNamespace(hosts=lab.hosts[:n], ssh_config=lab.ssh_config, dir=lab.dir,
                                 launch_env=lab.launch_env, addr=lab.addr)


def measure_link(lab, cluster, repeats: int = 50, rounds: int = 5) -> dict:
    """Return alpha and B from `rounds` ping-pongs between h1 and h2 (engines 0 and 1): small messages `repeats`
    times, large ones 5 times, each size's median; alpha and B fitted per round, then their medians and min-max
    over the rounds; the same link's latency with bare sockets in each round (`socket_alpha`: the rounds' median
    of each round's median 4-byte one-way time, and their min-max: what of alpha is the link's); and the TCP
    stream rate."""
    fits, sock, ping = [], [], lambda sizes, n: cluster.wait(cluster.view.apply_async(
        pingpong, sizes, n, cluster.timeout, False))[0]
    for _ in range(rounds):
        res = {**ping(PINGPONG_SMALL, repeats), **ping(PINGPONG_LARGE, 5)}
        fits.append(fit_alpha_beta(list(res), list(res.values())))
        sock.append(float(np.median(netlab_rate.echo(lab, "h1", "h2", 4 * repeats))))
    alphas, Bs = [a for a, _ in fits], [b for _, b in fits]
    stream = lab.measure_rate("h1", "h2", seconds=2.0)
    return {"alpha": float(np.median(alphas)), "B": float(np.median(Bs)), "alpha_range": [min(alphas), max(alphas)],
            "B_range": [min(Bs), max(Bs)], "alphas": alphas, "rounds": rounds, "repeats": repeats,
            "socket_alpha": float(np.median(sock)), "socket_alpha_range": [min(sock), max(sock)],
            "pingpong": {str(k): v for k, v in res.items()}, "stream": stream}


def _row(N: int, impl: str, nbytes: int, per_rank: list[dict], link: dict) -> dict:
    """One result row: slowest rank per call (median over calls, and their min-max: `range`), busbw, NIC bytes per
    host, the model (latency overhead o = 0 until `latency` fits it)."""
    slowest = np.max([r["seconds"] for r in per_rank], axis=0)
    seconds = float(np.median(slowest))
    model = predict(SCHEME.get(impl, "ring"), N, nbytes, link["alpha"], link["B"])
    return {"N": N, "impl": impl, "bytes": nbytes, "seconds": seconds, "range": [float(slowest.min()),
            float(slowest.max())], "model_s": float(model),
            "busbw": busbw(nbytes, seconds, N), "ok": all(r["ok"] for r in per_rank),
            "tx": [r["tx"] for r in per_rank], "rx": [r["rx"] for r in per_rank], **_payloads(per_rank),
            "model_bytes": nbytes if impl == "ps" else ring_bytes(N, nbytes),
            "model_server_bytes": N * nbytes if impl == "ps" else None}


def _payloads(per_host: list[dict]) -> dict:
    """Each host NIC's payload per call, sent and received (its bytes less HEADER_BYTES a packet), and the TCP
    segments each host resent per call."""
    return {"tx_payload": [payload(r["tx"], r.get("tx_packets", 0)) for r in per_host],
            "rx_payload": [payload(r["rx"], r.get("rx_packets", 0)) for r in per_host],
            "retrans": [r.get("retrans", 0) for r in per_host]}


def run_ps(lab, cluster, N: int, sizes, reps: int, link: dict) -> list[dict]:
    """Start the PS server on h(N+1), move the N engines into its group, time the exchange; return rows (the
    server's NIC bytes first in tx/rx, then the workers')."""
    host = lab.hosts[N]
    env = {**os.environ, "PYTHONPATH": KIT_ROOT, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "kit.netlab.exchange", "serve", lab.addr_of(host), str(N + 1),
            json.dumps(list(sizes)), str(reps), str(cluster.timeout)]
    server = subprocess.Popen(lab.exec_cmd(host, *argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)
    try:
        port = server.stdout.readline().strip()
        if not port.isdigit():
            raise RuntimeError(f"the PS server on {host} did not start: {server.communicate(timeout=60)[1][-800:]}")
        init = f"tcp://{lab.addr_of(host)}:{port}"
        wait_s = 60 + (reps + SMALL_REPS + 1) * sum(t_comm_ps(N, K, 0, 0.2 * link["B"]) for K in sizes)
        workers = cluster.wait(cluster.view.apply_async(engine_ps_worker, init, list(sizes), reps, cluster.timeout),
                               timeout=wait_s)
        served, err = server.communicate(timeout=60)
        if server.returncode:
            raise RuntimeError(f"the PS server on {host} failed: {err[-800:]}")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    served = json.loads(served.strip().splitlines()[-1])
    rows = []
    for i, nbytes in enumerate(sizes):
        per_rank = [w[i] for w in workers]
        row = _row(N, "ps", nbytes, per_rank, link)
        row["ok"] = row["ok"] and served[i]["ok"]
        row["tx"], row["rx"] = [served[i]["tx"], *row["tx"]], [served[i]["rx"], *row["rx"]]
        row.update({k: v + row[k] for k, v in _payloads([served[i]]).items()})     # the server's first
        rows.append(row)
    return rows


def run_n(lab, N: int, sizes, reps: int, impls, link: dict | None, timeout: float = 120,
          quiet: bool = True, link_rounds: int = 5) -> tuple[dict, list]:
    """Measure every implementation in `impls` at every size on the first N hosts of `lab` (the PS server on host
    N+1); measure the link first when `link` is None; return (link, rows)."""
    from kit import cluster as kc
    rows = []
    with kc.start(n=N, backend="gloo", hosts=_hosts(lab, N), timeout=timeout, quiet=True) as c:
        c.init_process_group()
        link = link or {"rate": lab.rate, "rate_bytes_per_s": lab_rate(lab), **measure_link(lab, c, rounds=link_rounds)}
        rows += _time_impls(c, N, [i for i in impls if i not in ("ps", "horovod_mpi")], sizes, reps, link, quiet)
        if "ps" in impls:
            rows += run_ps(lab, c, N, sizes, reps, link)
    if "horovod_mpi" in impls:      # one job at a time: the MPI job starts after the Gloo job has stopped
        with kc.start(n=N, backend="mpi", hosts=_hosts(lab, N), timeout=timeout, quiet=True) as c:
            c.init_process_group()   # for the barriers around the timed calls
            rows += _time_impls(c, N, ["horovod_mpi"], sizes, reps, link, quiet)
    return link, rows


def lab_rate(lab) -> float:
    """Return the rate the lab's links were set to, in bytes/s."""
    return parse_rate(lab.rate) / 8


def _time_impls(c, N: int, impls, sizes, reps: int, link: dict, quiet: bool) -> list[dict]:
    rows = []
    for impl in impls:
        for nbytes in sizes:
            rows.append(_row(N, impl, nbytes, c.wait(c.view.apply_async(engine_time, impl, nbytes,
                                                                      reps_for(nbytes, reps))), link))
            if not quiet:
                print(_line(rows[-1]), flush=True)
    return rows


def _line(r: dict) -> str:
    return (f"N={r['N']} {r['impl']:8s} {r['bytes'] / 2**20:5.0f} MB: {r['seconds'] * 1e3:7.0f} ms "
            f"(model {r['model_s'] * 1e3:.0f}), busbw {r['busbw'] / 1e6:.0f} MB/s")


def latency(x: dict) -> dict:
    """Return how the run's smallest messages paid latency: the PS's per-message overhead o fitted to its
    smallest-K steps against N with the ping-pong's alpha (one alpha for every N; bytes term taken off), the
    ring's time per message in sequence (time / 2(N-1)), the ping-pong's alpha; o is None without a PS row at
    N > 1."""
    K, link = min(x["sizes"]), x["link"]
    ps = {r["N"]: r["seconds"] for r in x["rows"] if r["impl"] == "ps" and r["bytes"] == K}
    ring = {r["N"]: r["seconds"] for r in x["rows"] if r["impl"] == "ring" and r["bytes"] == K}
    out = {"K": K, "alpha_pingpong": link["alpha"], "ps_seconds": ps, "ring_seconds": ring,
           "ring_alpha": {n: t / (2 * (n - 1)) for n, t in ring.items()}, "ps_alpha": link["alpha"], "o": None}
    if any(n > 1 for n in ps):
        ns = sorted(ps)
        bytes_s = [float(t_comm_ps(n, K, 0, link["B"])) for n in ns]
        out["o"] = fit_latency(ns, [ps[n] - b for n, b in zip(ns, bytes_s)], alpha=link["alpha"])[1]
    return out


def _with_overhead(x: dict) -> None:
    """Put the fitted overhead o into the PS and co-located rows' model (`model_s`)."""
    o = max(x["latency"]["o"] or 0.0, 0.0)
    for r in x["rows"]:
        if r["impl"] in SCHEME:
            r["model_s"] = float(predict(SCHEME[r["impl"]], r["N"], r["bytes"], x["link"]["alpha"], x["link"]["B"],
                                         o=o))


def experiment(ns=(2, 4), sizes=(4 << 20, 64 << 20), rate: str = "1gbit", reps: int = 3, impls=IMPLS,
               quiet: bool = True, link_rounds: int = 5) -> dict:
    """Run the experiment for every N in `ns` on one lab of max(ns) + 1 hosts, its link measured once (in
    `link_rounds` rounds of ping-pongs); return the link, the latency fit and the rows."""
    bad = [i for i in impls if i not in IMPLS]
    if bad or not ns or any(n < 2 for n in ns):
        raise ValueError(f"impls must come from {IMPLS} (got {bad}) and every N must be >= 2 (got {list(ns)})")
    t0, link, rows = time.time(), None, []
    with start_lab(hosts=max(ns) + ("ps" in impls), rate=rate) as lab:
        for N in sorted(ns):
            link, more = run_n(lab, N, sizes, reps, impls, link, quiet=quiet, link_rounds=link_rounds)
            rows += more
    x = {"rate": rate, "sizes": list(sizes), "ns": sorted(ns), "reps": reps, "link": link,
         "links": {N: link for N in sorted(ns)}, "rows": rows}
    x["latency"] = latency(x)
    _with_overhead(x)
    x["seconds"] = time.time() - t0
    return x


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve_main(sys.argv[2:])
