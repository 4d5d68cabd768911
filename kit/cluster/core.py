"""N ipyparallel engines as ONE Horovod job (and one torch.distributed group), started from a notebook.

    cluster = kit.cluster.start(n=2, backend="gloo")    # or backend="mpi"; `with ... as cluster:` too
    %%px
    import horovod.torch as hvd; hvd.init()            # hvd.size() == 2, hvd.rank() == engine's rank
    cluster.stop()                                     # engines, controller, rendezvous server: all gone

How the engines are started (gloo: plain processes + Horovod's rendezvous server; mpi: mpiexec) lives in
``kit.cluster.launchers``, one class per way; this module holds what every way shares: the life cycle, the device
plan (which GPU each engine sees), the slots, the watch for dead engines and the controller, and the clean-up.
Arguments are checked in ``kit.cluster.checks``; a stopped or broken cluster refuses through ``kit.cluster.guard``.
"""
from __future__ import annotations

import contextlib
import os
import time

from kit import env, scratch, sysinfo
from kit.cluster import engines, guard, launchers, live, remote, stall, waiting
from kit.cluster import slurm as kit_slurm
from kit.cluster.checks import ArgumentError, Hosts, check_local_ip, check_start
from kit.cluster.devices import plan_devices, threads_per_engine
from kit.cluster.engines import engine_env
from kit.cluster.guard import ClusterStoppedError
from kit.cluster.launchers import LAUNCHERS, LOCALHOST, ClusterError, assign_slots, launcher

BACKENDS = tuple(LAUNCHERS)
DEFAULT_TIMEOUT = 60.0
START_FLOOR = 120.0    # s: a whole start may take max(START_FLOOR, 2 x timeout) (engines importing frameworks)


def start_limit(timeout: float) -> float:
    """Return the seconds a whole start may take (controller, engines, set-up, Horovod's check) for `timeout`."""
    return max(START_FLOOR, 2 * timeout)


class Cluster(guard.Refusing):
    """N engines as one job. Use `kit.cluster.start(...)` to make one; its arguments are start's."""

    def __init__(self, n: int = 2, backend: str = "gloo", *, timeout: float = DEFAULT_TIMEOUT, devices: str = "auto",
                 share_gpus: bool = False, threads: int | None = None, mpiexec: str | None = None,
                 hosts: str | list[str] | Hosts | None = None, slurm=None, ip: str = LOCALHOST, quiet: bool = False,
                 oversubscribe: bool = False, allow_all_interfaces: bool = False):
        a = check_start(n=n, backend=backend, timeout=timeout, devices=devices, share_gpus=share_gpus,
                        threads=threads, mpiexec=mpiexec, hosts=hosts, slurm=slurm, ip=ip, quiet=quiet,
                        oversubscribe=oversubscribe, allow_all_interfaces=allow_all_interfaces,
                        backends=tuple(LAUNCHERS))   # LAUNCHERS: a new way is one entry
        n, ip, mpiexec = a["n"], a["ip"], a["mpiexec"]
        if a["hosts"] is None and slurm is None:
            self.hosts, self.launcher = None, launcher(backend, ip=ip, mpiexec=mpiexec)
        else:  # engines on other hosts: over SSH ("server1:4,server2:4" or a kit.netlab lab), or one Slurm job
            how, where = (remote, a["hosts"]) if slurm is None else (kit_slurm, slurm)
            self.hosts, ip, self.launcher = how.launcher_for(backend, where, n, ip, mpiexec)
        self.launcher.check()
        check_local_ip(ip)    # servers listen on it (after the launcher's own checks: they name unreachable hosts)
        if not self.hosts:  # all n engines on this host: fail before starting anything
            plan_devices(sysinfo.visible_gpus(), n, devices, share_gpus)
        self.n, self.backend, self.timeout = n, backend, a["timeout"]
        self.devices, self.share_gpus, self.threads, self.ip, self.quiet = devices, share_gpus, threads, ip, quiet
        self.kind = (backend, "slurm" if slurm is not None else tuple(self.hosts.items()) if self.hosts else "local")
        self.kind_text = f"backend {backend!r}, " + ("Slurm" if slurm is not None else
                                                     f"hosts {a['hosts']!r}" if self.hosts else "this machine")
        self._client = self._view = self.slots = self._ipp = self._profile = self._dir = self._watch = None
        self.gpus: list[str] = []        # the GPU ids handed out by local rank ([] = engines run on the CPU)
        self.dead: dict[int, str] = {}   # rank -> how it died (see poll_dead), first death first
        self._procs: dict[int, int] = {}      # pid -> start ticks, of every process the start made
        self._pids, self._outputs = {}, {}    # rank -> engine pid; engine pid -> its output file (local engines)
        self._marks: dict[int, int] = {}      # engine pid -> size of its output file when its last task was sent
        self._stop_w, self._ctl_w, self._before = None, None, {}    # _before: pid -> start ticks before the start
        self._state, self.started_at, self._stopped_at = "new", "", ""   # new, starting, running, stopped
        self._controller: tuple[int, str] | None = None     # (pid, when it died) once the controller is gone
        self._deadline: float | None = None   # while starting: time.monotonic() by which the start must be done
        self._pending, self.from_cell = guard.Pending(), False   # from_cell: started by a cell's own call (live)

    # -- public API
    @property
    def size(self) -> int:
        self._usable()
        return self.n

    @property
    def view(self):
        """The DirectView over every engine, ordered by rank (%%px targets it)."""
        self._usable()
        return self._view

    @property
    def client(self):
        """The ipyparallel Client of this cluster's controller."""
        self._usable()
        return self._client

    def rank_of(self, eid: int) -> int:
        """Return the Horovod rank of engine `eid`."""
        self._usable()
        if isinstance(eid, bool) or eid not in self.slots:
            raise ArgumentError(f"cluster.rank_of: eid={eid!r} is not allowed: one of the engine ids "
                                f"{sorted(self.slots)}")
        return self.slots[eid].rank

    def engine_of(self, rank: int) -> int:
        """Return the engine id holding `rank`."""
        self._usable()
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.n:
            raise ArgumentError(f"cluster.engine_of: rank={rank!r} is not allowed: a rank from 0 to {self.n - 1}")
        return next(e for e, s in self.slots.items() if s.rank == rank)

    def start(self) -> "Cluster":
        """Start controller and engines, set each engine's slot, check that hvd.size() == n everywhere."""
        if self._state == "running":
            return self
        if self._state == "stopped":
            raise self.refusal()
        live.replace_same_kind(self)
        return self._start()

    def stop(self):
        """Stop engines, controller, mpiexec and the rendezvous server; wait until every process is gone. From then
        on every use of this cluster (or of its view, or a result it handed out) raises ClusterStoppedError."""
        if self._state in ("new", "stopped"):
            return
        self._state, self._stopped_at = "stopped", time.strftime("%H:%M:%S")
        self._shutdown(self.refusal())

    def restart(self) -> "Cluster":
        """Stop everything and start a fresh job with the same settings (no kernel restart needed)."""
        self._usable()
        self._shutdown(ClusterStoppedError(f"this cluster ({self.n} engines, backend {self.backend!r}) was "
                                           "restarted while this result was pending: run it again"))
        return self._start()

    def init_process_group(self, backend: str = "gloo") -> dict[int, int]:
        """Join every engine to one torch.distributed process group with the Horovod ranks.

        backend: "gloo" (CPU tensors; the default) or "nccl" (CUDA tensors; one GPU per engine: NCCL refuses two
        ranks on one GPU, NVIDIA/nccl#418)."""
        self._usable(broken=False)
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"init_process_group: backend={backend!r} is not allowed: use 'gloo' or 'nccl'")
        if backend == "nccl" and not self.gpus:
            raise ClusterError("init_process_group: backend='nccl' needs one GPU per engine, and these engines run "
                               f"on the CPU (devices={self.devices!r}, no GPU given to them): use backend='gloo'")
        hosts = {s.hostname for s in self.slots.values()}
        if len(hosts) == 1:
            # One host: a FileStore rendezvous, so no TCP store server listens anywhere.
            path = os.path.join(self._profile, f"torch-dist-{time.time_ns()}")
            init_method = f"file://{path}"
        else:  # the TCP store listens on rank 0's host
            host, port = self.answers(self._client[self.engine_of(0)].apply_async(engines.engine_free_address),
                                      "init_process_group (a free port on rank 0's host)", self.timeout)
            init_method = f"tcp://{host}:{port}"
        res = self._view.apply_async(engines.engine_init_process_group, init_method, self.timeout, backend)
        out = self.answers(res, "init_process_group", self.timeout + 60)   # the engines give up after timeout
        ranks = {eid: r["rank"] for eid, r in zip(self._view.targets, out)}
        bad = [r for r in out if r["size"] != self.n or r["sum"] != self.n]
        if bad or ranks != {e: s.rank for e, s in self.slots.items()}:
            raise ClusterError(f"torch.distributed group is not the expected one: {out}")
        return ranks

    def wait(self, async_result, timeout: float | None = None):
        """Return an AsyncResult's value; if an engine died (or its host is cut off), raise RankDiedError naming it;
        if a rank never joined a collective the others wait in, StallError naming it (after `self.timeout`); if the
        controller died, ControllerDiedError. (kit.cluster.waiting)"""
        return waiting.wait(self, async_result, timeout)

    @property
    def stall(self) -> "stall.Stall | None":
        """The stall found in this job (see kit.cluster.stall), or None."""
        self._usable()
        return self._watch.explain() if self._watch is not None else None

    def poll_dead(self) -> dict[int, str]:
        """Check every engine process now; return {rank: what happened} for those that died (first first)."""
        return waiting.poll_dead(self)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- internals
    def _start(self) -> "Cluster":
        import ipyparallel as ipp
        self._state, self.started_at = "starting", time.strftime("%H:%M:%S")
        self.dead, self._procs, self._pids, self._outputs, self._marks, self._controller = {}, {}, {}, {}, {}, None
        self._before = engines.descendants()
        live.add(self)
        t0 = time.time()
        limit = start_limit(self.timeout)
        self._deadline = time.monotonic() + limit
        try:
            self._dir = scratch.make("cluster")   # profile, engines' TMPDIR, stall watch: removed on stop
            self._profile = os.path.join(self._dir, "profile")
            self._ipp = ipp.Cluster(n=self.n, profile_dir=self._profile, controller_ip=self.ip,
                                    engine_timeout=int(max(60, self.timeout)), log_level=40, parent=None,
                                    controller_args=launchers.HEARTBEAT)
            self.launcher.configure(self._ipp)
            launchers.bound(self._ipp, self._deadline)     # no engine started after the deadline
            launchers.set_environment(self._ipp.config, os.path.join(self._dir, "tmp"))
            self._ipp.start_cluster_sync(n=self.n)
            self._watch_controller()
            self._client = guard.guard_client(self._ipp.connect_client_sync(), self)
            stall.forward_interrupts(self._client, lambda: self._watch)   # %%px's stop button: kit.cluster.stall
            self.launcher.wait_for_engines(self._client, self.n, timeout=self._left())
            self._setup_engines()
            self._procs, self._outputs = self._new_processes(), engines.output_files(self._ipp)
            self._watch_engines()
            self._state = "running"
            self._check_horovod()
            self._watch = stall.Watch(os.path.join(self._dir, "stall"), self.n, self.timeout)
            self._deadline = None
        except BaseException as e:
            up, late = self._registered(), self._deadline is not None and time.monotonic() >= self._deadline - 0.5
            self._deadline = None
            self.stop()
            if late:
                raise ClusterError(f"kit.cluster.start: {up} of {self.n} engines were up after {limit:.0f} s, the "
                                   "limit of a whole start (max(120, 2 x timeout) s); everything it started is "
                                   "stopped. Start fewer engines, or give a longer timeout=") from e
            raise
        if not self.quiet:
            print(self._summary(time.time() - t0))
        return self

    def _left(self) -> float:
        """Return the seconds left of a start's limit (at least 0.1: a step then fails at once)."""
        return self.timeout if self._deadline is None else max(0.1, self._deadline - time.monotonic())

    def _registered(self) -> int:
        """Return how many engines have registered with the controller (0 before a client connects)."""
        try:
            return len(self._client.ids) if self._client is not None else 0
        except Exception:
            return 0

    def _shutdown(self, err: ClusterError):
        """Stop every process and server of the current job (stop, and restart before it starts again); results
        still pending fail with `err`."""
        live.discard(self)
        self._stop_w, self._ctl_w = engines.end_watch(self._stop_w), engines.end_watch(self._ctl_w)
        if self._watch is not None:
            self._watch.stop()
        procs = dict(self._procs) or self._new_processes()  # start may have failed half-way
        self._pending.fail(err)
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
        self.launcher.end_engines(procs)           # local Gloo engines, all at once (ipyparallel: one by one)
        if self._ipp is not None:
            with contextlib.suppress(Exception):
                self._ipp.stop_cluster_sync()
        # stop_cluster_sync() can return before every engine has exited (or leave mpiexec's children): reap.
        engines.reap(procs)
        self.launcher.stop()
        # and what the list above missed (under load: a controller's scheduler forked after it, then orphaned)
        scratch.remove(self._dir, end_processes=True)
        self._client = self._view = self._watch = None

    def _setup_engines(self):
        ids = sorted(self._client.ids)
        info = dict(zip(ids, self.answers(self._client[ids].apply_async(engines.engine_identity),
                                          "start (who each engine is)", self._left())))
        ids = self.launcher.rank_order(info)
        self.slots = assign_slots({e: info[e]["host"] for e in ids})
        self.launcher.check_slots(self.slots, info)
        self._pids = {self.slots[e].rank: info[e]["pid"] for e in sorted(ids, key=lambda e: self.slots[e].rank)}
        self._here = {self.slots[e].rank for e in ids if info[e].get("machine") == env.machine_id()}   # watchable pids
        local_size = max(s.local_size for s in self.slots.values())
        self.gpus, notice = plan_devices(sysinfo.visible_gpus(), local_size, self.devices, self.share_gpus)
        if notice and not self.quiet:
            print(notice)
        self._threads = self.threads or threads_per_engine(info)
        envs = {e: engine_env(s, gpus=self.gpus, threads=self._threads, timeout=self.timeout, folder=self._dir)
                for e, s in self.slots.items()}
        for e, extra in self.launcher.job_env(self.slots).items():
            envs[e].update(extra)
        for e, p in [(e, self._client[e].apply_async(engines.engine_setup, envs[e])) for e in ids]:
            self.answers(p, f"start (engine {e}'s environment)", min(self.timeout, self._left()))
        self._view = guard.guard_view(self._client[[self.engine_of(r) for r in range(self.n)]], self)
        self._view.block = True
        if engines.in_ipython():
            self._view.activate()  # %%px / %px now target this job
            engines.install_ipython_hook(live.explain)

    def _check_horovod(self):
        out = self.wait(self._view.apply_async(engines.engine_check_horovod), timeout=self._left())
        for eid, r in zip(self._view.targets, out):
            want = self.slots[eid]
            if r["size"] != self.n or r["rank"] != want.rank or r["sum"] != self.n:
                raise ClusterError(f"engine {eid}: Horovod says rank {r['rank']} of {r['size']} "
                                   f"(allreduce of ones = {r['sum']}), expected rank {want.rank} of {self.n}")

    def _watch_engines(self):
        """Note each engine's death the moment it happens, so the first to die is named first."""
        def died(rank):
            self.dead.setdefault(rank, self._how_it_died(rank))
        self._stop_w = engines.watch_deaths({r: p for r, p in self._pids.items() if r in self._here}, died)

    def _how_it_died(self, rank: int) -> str:
        return waiting.how_it_died(self, rank)

    def _new_processes(self) -> dict[int, int]:
        return {p: c for p, c in engines.descendants().items() if p not in self._before}

    def _summary(self, seconds):
        where = f"GPUs {','.join(self.gpus)}" if self.gpus else \
            "CPU only" + ("" if sysinfo.visible_gpus() else " (no GPU found)")
        same = all(e == s.rank for e, s in self.slots.items())
        return (f"kit.cluster: {self.n} engines as one {self.backend} job of size {self.n} "
                f"({'engine id = rank' if same else 'see cluster.rank_of(eid)'}), {where}, "
                f"{self._threads} thread(s) per engine, started in {seconds:.1f} s")


def start(n: int = 2, backend: str = "gloo", *, timeout: float = DEFAULT_TIMEOUT, devices: str = "auto",
          share_gpus: bool = False, threads: int | None = None, mpiexec: str | None = None,
          hosts: str | list[str] | Hosts | None = None, slurm=None, ip: str = LOCALHOST,
          quiet: bool = False, oversubscribe: bool = False, allow_all_interfaces: bool = False) -> Cluster:
    """Start n engines as one Horovod job; return the Cluster (also usable as a context manager).

    n and backend may be given by position; every other argument by name. Every argument is checked before anything
    starts (kit.cluster.checks: a bad one is an ArgumentError naming it).
    Called from a notebook cell, it first stops (with a notice) a live cluster of the same kind that a cell of this
    kernel started: a start cell run again replaces its cluster (kit.cluster.live).

    n: engines (a whole number >= 1; on this machine or a lab's hosts at most 4 per core and one per 0.5 GiB of
        available memory unless oversubscribe=True). backend: "gloo" (no MPI needed) or "mpi" (the venv's mpiexec).
    timeout: seconds (finite, > 0; default 60) a collective waits for a dead or missing peer; whole-second
        settings (Horovod's Gloo timeout, its stall inspector) get it rounded up. The whole start may take
        start_limit(timeout) = max(120, 2 x timeout) s: then it stops what it started and says how many were up.
    devices: "auto" (one GPU per engine when there are enough, else CPU with a notice), "cpu", or "gpu" (one GPU
        per local rank, an error when too few). share_gpus: let several engines share a GPU.
    threads: framework threads per engine (default: the cores of each machine split between its engines).
    mpiexec: the path of mpiexec (default: the venv's, else PATH's).
    hosts: engines over SSH: horovodrun's "server1:4,server2:4", a list of host names (n split evenly), or a
        kit.netlab lab (any kit.cluster.Hosts: n // len(lab.hosts) per host, servers on lab.addr, the lab's ssh).
    slurm: engines as one Slurm job: a kit.netlab.slurm cluster, or options such as dict(partition=, account=,
        time=, nodes=, sbatch=[...]) (kit.cluster.slurm). Not with hosts.
    ip: the address servers bind: one of this machine's interfaces (default 127.0.0.1; with hosts or slurm, one
        the hosts reach). allow_all_interfaces: allow ip="0.0.0.0" or "::" (every interface; Horovod's Gloo
        rendezvous has no authentication).
    quiet: no start-up line. oversubscribe: start more engines than the cores and memory hold (docs/cluster.md).
    """
    cluster = Cluster(n=n, backend=backend, timeout=timeout, devices=devices, share_gpus=share_gpus, threads=threads,
                      mpiexec=mpiexec, hosts=hosts, slurm=slurm, ip=ip, quiet=quiet, oversubscribe=oversubscribe,
                      allow_all_interfaces=allow_all_interfaces)
    cluster.from_cell = live.called_from_cell()     # a notebook cell's own call: it replaces its predecessor
    return cluster.start()
