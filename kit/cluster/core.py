"""N ipyparallel engines as ONE Horovod job (and one torch.distributed group), started from a notebook.

    cluster = kit.cluster.start(n=2, backend="gloo")    # or backend="mpi"; `with ... as cluster:` too
    %%px
    import horovod.torch as hvd; hvd.init()            # hvd.size() == 2, hvd.rank() == engine's rank
    cluster.stop()                                     # engines, controller, rendezvous server: all gone

How the engines are started (gloo: plain processes + Horovod's rendezvous server; mpi: mpiexec) lives in
``kit.cluster.launchers``, one class per way; this module holds what every way shares: argument checks, the device plan
(which GPU each engine sees), the slots, the engines' environment, the watch for dead engines and the clean-up.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time

from kit import env as kit_env, scratch, sysinfo
from kit.cluster import engines, launchers, remote, stall
from kit.cluster import slurm as kit_slurm
from kit.cluster.devices import plan_devices, threads_per_engine
from kit.cluster.launchers import LAUNCHERS, LOCALHOST, ClusterError, Slot, assign_slots, launcher

BACKENDS = tuple(LAUNCHERS)
DEFAULT_TIMEOUT = 60.0


class RankDiedError(ClusterError):
    """An engine died while the job was running."""


class StallError(ClusterError):
    """Some rank never joined a collective that the others waited in (kit.cluster.stall)."""


def engine_env(slot: Slot, *, gpus: list[str], threads: int, timeout: float, folder: str = "") -> dict[str, str]:
    """Return the environment one engine needs before it imports any framework (folder: the cluster's scratch
    folder, where its TMPDIR and stall watch live)."""
    env = {
        "KIT_RANK": slot.rank, "KIT_SIZE": slot.size, "KIT_LOCAL_RANK": slot.local_rank,
        "KIT_LOCAL_SIZE": slot.local_size, "KIT_TIMEOUT": int(timeout), "PYTHONUNBUFFERED": 1,
        **kit_env.FRAMEWORK_ENV,
        # n engines share the cores: each framework gets cores / local_size intra-op threads.
        "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TF_NUM_INTRAOP_THREADS": threads,
        # One GPU per process, chosen by local rank (set before any framework sees the devices): inside the
        # engine that GPU is device 0. No GPUs in the plan: the engine sees none and runs on the CPU.
        "CUDA_VISIBLE_DEVICES": gpus[slot.local_rank % len(gpus)] if gpus else "",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": int(timeout),
        **stall.horovod_env(timeout),
    }
    if folder:
        env.update(TMPDIR=os.path.join(folder, "tmp"), KIT_STALL_DIR=os.path.join(folder, "stall"))
    return {k: str(v) for k, v in env.items()}


def _check_args(n, backend, timeout, hosts=None, slurm=None):
    if hosts is not None and slurm is not None:
        raise ValueError("give hosts= (SSH) or slurm= (a Slurm job), not both: Slurm chooses the hosts")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a whole number of engines >= 1, got {n!r}: e.g. kit.cluster.start(n=2)")
    if backend not in LAUNCHERS:
        raise ValueError(f"unknown backend {backend!r}: use backend='gloo' (no MPI needed) or backend='mpi'")
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


class Cluster:
    """N engines as one job. Use `kit.cluster.start(...)` to make one."""

    def __init__(self, n=2, backend="gloo", *, timeout=DEFAULT_TIMEOUT, devices="auto", share_gpus=False,
                 threads=None, mpiexec=None, hosts=None, slurm=None, ip=LOCALHOST, quiet=False):
        _check_args(n, backend, timeout, hosts, slurm)
        if hosts is None and slurm is None:
            self.hosts, self.launcher = None, launcher(backend, ip=ip, mpiexec=mpiexec)
        else:  # engines on other hosts: over SSH ("server1:4,server2:4" or a kit.netlab lab), or one Slurm job
            how, where = (remote, hosts) if slurm is None else (kit_slurm, slurm)
            self.hosts, ip, self.launcher = how.launcher_for(backend, where, n, ip, mpiexec)
        self.launcher.check()
        if not self.hosts:  # all n engines on this host: fail before starting anything
            plan_devices(sysinfo.visible_gpus(), n, devices, share_gpus)
        self.n, self.backend, self.timeout = n, backend, float(timeout)
        self.devices, self.share_gpus, self.threads, self.ip, self.quiet = devices, share_gpus, threads, ip, quiet
        self.client = self.view = self.slots = None
        self.gpus: list[str] = []        # the GPU ids handed out by local rank ([] = engines run on the CPU)
        self.dead: dict[int, str] = {}   # rank -> how it died (see poll_dead), first death first
        self._ipp = self._profile = self._dir = self._watch = None
        self._procs: dict[int, int] = {}      # pid -> start ticks, of every process the start made
        self._pids, self._outputs = {}, {}    # rank -> engine pid; engine pid -> its output file (local engines)
        self._stop_w = None
        self._before: dict[int, float] = {}
        self._stopped = True

    # -- public API
    @property
    def size(self) -> int:
        return self.n

    def rank_of(self, eid: int) -> int:
        """Return the Horovod rank of engine `eid`."""
        return self.slots[eid].rank

    def engine_of(self, rank: int) -> int:
        """Return the engine id holding `rank`."""
        return next(e for e, s in self.slots.items() if s.rank == rank)

    def start(self) -> "Cluster":
        """Start controller and engines, set each engine's slot, check that hvd.size() == n everywhere."""
        import ipyparallel as ipp
        if not self._stopped:
            return self
        self._stopped, self.dead, self._procs, self._pids, self._outputs = False, {}, {}, {}, {}
        self._before = engines.descendants()
        _LIVE.add(self)
        t0 = time.time()
        try:
            self._dir = scratch.make("cluster")   # profile, engines' TMPDIR, stall watch: removed on stop
            self._profile = os.path.join(self._dir, "profile")
            self._ipp = ipp.Cluster(n=self.n, profile_dir=self._profile, controller_ip=self.ip,
                                    engine_timeout=int(max(60, self.timeout)), log_level=40, parent=None,
                                    controller_args=launchers.HEARTBEAT)
            self.launcher.configure(self._ipp)
            launchers.set_environment(self._ipp.config, os.path.join(self._dir, "tmp"))
            self._ipp.start_cluster_sync(n=self.n)
            self.client = self._ipp.connect_client_sync()
            stall.forward_interrupts(self.client, lambda: self._watch)   # %%px's stop button: see kit.cluster.stall
            self.launcher.wait_for_engines(self.client, self.n, timeout=max(60, self.timeout))
            self._setup_engines()
            self._procs, self._outputs = self._new_processes(), engines.output_files(self._ipp)
            self._watch_engines()
            self._check_horovod()
            self._watch = stall.Watch(os.path.join(self._dir, "stall"), self.n, self.timeout)
        except BaseException:
            self.stop()
            raise
        if not self.quiet:
            print(self._summary(time.time() - t0))
        return self

    def stop(self):
        """Stop engines, controller, mpiexec and the rendezvous server; wait until every process is gone."""
        if self._stopped:
            return
        self._stopped = True
        _LIVE.discard(self)
        self._stop_w = engines.end_watch(self._stop_w)
        if self._watch is not None:
            self._watch.stop()
        procs = dict(self._procs) or self._new_processes()  # start may have failed half-way
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        self.launcher.end_engines(procs)           # local Gloo engines, all at once (ipyparallel: one by one)
        if self._ipp is not None:
            with contextlib.suppress(Exception):
                self._ipp.stop_cluster_sync()
        # stop_cluster_sync() can return before every engine has exited (or leave mpiexec's children): reap.
        engines.reap(procs)
        self.launcher.stop()
        # and what the list above missed (under load: a controller's scheduler forked after it, then orphaned)
        scratch.remove(self._dir, end_processes=True)
        self.client = self.view = self._watch = None

    def restart(self) -> "Cluster":
        """Stop everything and start a fresh job with the same settings (no kernel restart needed)."""
        self.stop()
        return self.start()

    def init_process_group(self, backend: str = "gloo") -> dict[int, int]:
        """Join every engine to one torch.distributed process group with the Horovod ranks.

        backend: "gloo" (CPU tensors; the default) or "nccl" (CUDA tensors; one GPU per engine: NCCL refuses two
        ranks on one GPU, NVIDIA/nccl#418)."""
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        hosts = {s.hostname for s in self.slots.values()}
        if len(hosts) == 1:
            # One host: a FileStore rendezvous, so no TCP store server listens anywhere.
            path = os.path.join(self._profile, f"torch-dist-{time.time_ns()}")
            init_method = f"file://{path}"
        else:  # the TCP store listens on rank 0's host
            host, port = self.client[self.engine_of(0)].apply_sync(engines.engine_free_address)
            init_method = f"tcp://{host}:{port}"
        res = self.view.apply_async(engines.engine_init_process_group, init_method, self.timeout, backend)
        out = self.wait(res)
        ranks = {eid: r["rank"] for eid, r in zip(self.view.targets, out)}
        bad = [r for r in out if r["size"] != self.n or r["sum"] != self.n]
        if bad or ranks != {e: s.rank for e, s in self.slots.items()}:
            raise ClusterError(f"torch.distributed group is not the expected one: {out}")
        return ranks

    def wait(self, async_result, timeout: float | None = None):
        """Return an AsyncResult's value; if an engine died (or its host is cut off), raise RankDiedError naming it;
        if a rank never joined a collective the others wait in, StallError naming it (after `self.timeout`)."""
        from ipyparallel.error import EngineError, RemoteError   # RemoteError: also CompositeError (a view)
        deadline = None if timeout is None else time.time() + timeout
        while not async_result.ready() and (deadline is None or time.time() < deadline):
            # engines behind a cut link never answer: once some part failed, look for lost ranks
            failed = any(isinstance(self.client.results.get(m), Exception) for m in async_result.msg_ids)
            lost = self.launcher.lost_now(self.slots, after=self.timeout / 2) if self.slots else {}
            if lost or (failed and self.poll_dead()):
                raise self._died_error(lost)
            async_result.wait(1.0 if deadline is None else max(0.0, min(1.0, deadline - time.time())))
        try:
            return async_result.get(timeout=0 if deadline is not None else None)
        except (RemoteError, EngineError) as e:
            # ipyparallel may call an engine dead (missed heartbeats: one the OOM killer is reclaiming stalls) a
            # moment before its process is gone: give the process a few seconds to end before calling it alive.
            names = {type(e).__name__, getattr(e, "ename", "")} | {x[0] for x in getattr(e, "elist", []) if x}
            until = time.time() + (10 if "EngineError" in names else 0)
            while not self.poll_dead() and time.time() < until:
                time.sleep(0.2)
            if self.dead:
                raise self._died_error() from e
            if self.stall is not None:
                raise StallError(self.stall.message()) from e
            raise

    @property
    def stall(self) -> "stall.Stall | None":
        """The stall found in this job (see kit.cluster.stall), or None."""
        return self._watch.explain() if self._watch is not None else None

    def poll_dead(self) -> dict[int, str]:
        """Check every engine process now; return {rank: what happened} for those that died (first first)."""
        import psutil
        for rank, pid in (self._pids or {}).items():
            if rank in self.dead:
                continue
            try:
                gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                gone = True
            if gone:
                self.dead[rank] = self._how_it_died(rank)
        if self.slots and not self._stopped and len(self.dead) < self.n:
            for rank, why in self.launcher.lost_ranks(self.slots).items():
                self.dead.setdefault(rank, why)
        return self.dead

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        state = "stopped" if self._stopped else f"broken, dead ranks {sorted(self.poll_dead())}" if self.poll_dead() \
            else "running"
        return f"<kit.cluster.Cluster n={self.n} backend={self.backend!r} {state}>"

    # -- internals
    def _setup_engines(self):
        ids = sorted(self.client.ids)
        info = dict(zip(ids, self.client[ids].apply_sync(engines.engine_identity)))
        ids = self.launcher.rank_order(info)
        self.slots = assign_slots({e: info[e]["host"] for e in ids})
        self.launcher.check_slots(self.slots, info)
        self._pids = {self.slots[e].rank: info[e]["pid"] for e in sorted(ids, key=lambda e: self.slots[e].rank)}
        local_size = max(s.local_size for s in self.slots.values())
        self.gpus, notice = plan_devices(sysinfo.visible_gpus(), local_size, self.devices, self.share_gpus)
        if notice and not self.quiet:
            print(notice)
        self._threads = self.threads or threads_per_engine(info)
        envs = {e: engine_env(s, gpus=self.gpus, threads=self._threads, timeout=self.timeout, folder=self._dir)
                for e, s in self.slots.items()}
        for e, extra in self.launcher.job_env(self.slots).items():
            envs[e].update(extra)
        pending = [self.client[e].apply_async(engines.engine_setup, envs[e]) for e in ids]
        for p in pending:
            p.get(timeout=self.timeout)
        self.view = self.client[[self.engine_of(r) for r in range(self.n)]]
        self.view.block = True
        if engines.in_ipython():
            self.view.activate()  # %%px / %px now target this job
            engines.install_ipython_hook(_explain)

    def _check_horovod(self):
        out = self.wait(self.view.apply_async(engines.engine_check_horovod), timeout=max(120, 2 * self.timeout))
        for eid, r in zip(self.view.targets, out):
            want = self.slots[eid]
            if r["size"] != self.n or r["rank"] != want.rank or r["sum"] != self.n:
                raise ClusterError(f"engine {eid}: Horovod says rank {r['rank']} of {r['size']} "
                                   f"(allreduce of ones = {r['sum']}), expected rank {want.rank} of {self.n}")

    def _watch_engines(self):
        """Note each engine's death the moment it happens, so the first to die is named first."""
        def died(rank):
            self.dead.setdefault(rank, self._how_it_died(rank))
        self._stop_w = engines.watch_deaths(self._pids, died)

    def _how_it_died(self, rank: int) -> str:
        pid = self._pids[rank]
        why = engines.how_it_died(pid, self._procs.get(pid, 0), output=engines.last_output(self._outputs.get(pid, "")))
        return f"engine {self.engine_of(rank)} (pid {pid}) {why}"

    def _new_processes(self) -> dict[int, int]:
        return {p: c for p, c in engines.descendants().items() if p not in self._before}

    def _died_error(self, lost=None) -> RankDiedError:
        for rank, why in (lost or {}).items():
            self.dead.setdefault(rank, why)
        (first, why), *rest = self.dead.items()
        then = f"; then rank(s) {', '.join(str(r) for r, _ in rest)} went down with it" if rest else ""
        return RankDiedError(f"rank {first} died ({why}){then}. The job is broken: run cluster.restart() for a "
                             "fresh one (no kernel restart needed).")

    def _summary(self, seconds):
        where = f"GPUs {','.join(self.gpus)}" if self.gpus else \
            "CPU only" + ("" if sysinfo.visible_gpus() else " (no GPU found)")
        same = all(e == s.rank for e, s in self.slots.items())
        return (f"kit.cluster: {self.n} engines as one {self.backend} job of size {self.n} "
                f"({'engine id = rank' if same else 'see cluster.rank_of(eid)'}), {where}, "
                f"{self._threads} thread(s) per engine, started in {seconds:.1f} s")


def _explain(shell, etype, value, tb, tb_offset=None):
    """After a %%px cell failed: say which rank died or stalled, and what to do."""
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    for c in list(_LIVE):
        if c.poll_dead():
            print(f"kit.cluster: {c._died_error()}", file=sys.stderr)
        elif c.stall is not None:
            print(f"kit.cluster: StallError: {c.stall.message()}", file=sys.stderr)


_LIVE: set[Cluster] = set()   # started and not yet stopped: the kernel's exit stops them


@atexit.register
def _stop_all():
    """The kernel is exiting: stop every cluster it started."""
    for c in list(_LIVE):
        c.stop()


def start(n: int = 2, backend: str = "gloo", **kwargs) -> Cluster:
    """Start n engines as one Horovod job; return the Cluster (also usable as a context manager).

    kwargs: timeout (s, default 60: how long a collective waits for a dead peer), devices ("auto": one GPU
    per engine when there are enough, else CPU with a notice; "cpu"; "gpu": one GPU per local rank, an error
    when too few), share_gpus (let several engines share a GPU), threads (framework threads per engine;
    default cores // engines per host), mpiexec (path), hosts ("server1:4,server2:4": engines over MPI -H
    or ipyparallel SSH engines; or a kit.netlab lab: n // len(lab.hosts) engines on each of its hosts, servers
    on lab.addr, the lab's ssh), slurm (engines as one Slurm job: a kit.netlab.slurm cluster, or options such as
    dict(partition=, account=, time=, nodes=, sbatch=[...]); see kit.cluster.slurm), ip (the address servers
    bind; default 127.0.0.1, needed otherwise with hosts or slurm), quiet.
    """
    return Cluster(n, backend, **kwargs).start()
