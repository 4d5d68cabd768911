"""N ipyparallel engines as ONE Horovod job (and one torch.distributed group), started from a notebook.

    cluster = kit.cluster.start(n=2, backend="gloo")    # or backend="mpi"; `with ... as cluster:` too
    %%px
    import horovod.torch as hvd; hvd.init()            # hvd.size() == 2, hvd.rank() == engine's rank
    cluster.stop()                                     # engines, controller, rendezvous server: all gone

gloo: engines are plain processes; Horovod's own rendezvous server runs in this (the notebook's) process and
each engine is told its slot (rank, local rank, ...) through HOROVOD_* variables, as `horovodrun --gloo` does.
mpi:  engines are started by `mpiexec` (the venv's Open MPI from PyPI); Horovod takes ranks from MPI.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from . import sysinfo

BACKENDS = ("gloo", "mpi")
DEFAULT_TIMEOUT = 60.0
LOCALHOST = "127.0.0.1"


class ClusterError(RuntimeError):
    """The cluster cannot start or a job on it failed; the message says what to do."""


class RankDiedError(ClusterError):
    """An engine died while the job was running."""


@dataclass(frozen=True)
class Slot:
    """Where one engine sits in the job (Horovod's vocabulary)."""
    hostname: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def assign_slots(hostnames: dict[int, str]) -> dict[int, Slot]:
    """Map engine id -> Slot: ranks grouped by host (hosts in order of first engine id), as horovodrun does."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    order = [hostnames[e] for e in sorted(hostnames)]
    hosts = list(dict.fromkeys(order))
    plan = get_host_assignments(parse_hosts(",".join(f"{h}:{order.count(h)}" for h in hosts)), len(order))
    slots = {}
    for host in hosts:
        engines = [e for e in sorted(hostnames) if hostnames[e] == host]
        host_slots = sorted((s for s in plan if s.hostname == host), key=lambda s: s.local_rank)
        for eid, s in zip(engines, host_slots):
            slots[eid] = Slot(host, s.rank, s.size, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
    return slots


def engine_env(slot: Slot, *, gpus: list[str], threads: int, timeout: float) -> dict[str, str]:
    """Return the environment one engine needs before it imports any framework."""
    env = {
        "KIT_RANK": slot.rank, "KIT_SIZE": slot.size, "KIT_LOCAL_RANK": slot.local_rank,
        "KIT_LOCAL_SIZE": slot.local_size, "KIT_TIMEOUT": int(timeout),
        "TF_USE_LEGACY_KERAS": 1, "TF_CPP_MIN_LOG_LEVEL": 2, "PYTHONUNBUFFERED": 1,
        # n engines share the cores: each framework gets cores / local_size intra-op threads.
        "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TF_NUM_INTRAOP_THREADS": threads,
        # One GPU per process, chosen by local rank (set before any framework sees the devices).
        "CUDA_VISIBLE_DEVICES": gpus[slot.local_rank % len(gpus)] if gpus else "",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": int(timeout),
    }
    return {k: str(v) for k, v in env.items()}


def gloo_env(slot: Slot, *, addr: str, port: int, iface: str) -> dict[str, str]:
    """Return what `horovodrun --gloo` gives each worker: the rendezvous address and the worker's slot."""
    env = {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr, "HOROVOD_GLOO_RENDEZVOUS_PORT": port,
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_HOSTNAME": slot.hostname, "HOROVOD_RANK": slot.rank, "HOROVOD_SIZE": slot.size,
        "HOROVOD_LOCAL_RANK": slot.local_rank, "HOROVOD_LOCAL_SIZE": slot.local_size,
        "HOROVOD_CROSS_RANK": slot.cross_rank, "HOROVOD_CROSS_SIZE": slot.cross_size,
    }
    if iface:  # Horovod's and torch.distributed's Gloo listen on this interface only
        env.update(HOROVOD_GLOO_IFACE=iface, GLOO_SOCKET_IFNAME=iface)
    return {k: str(v) for k, v in env.items()}


def parse_hosts(hosts: str, n: int, ip: str) -> dict[str, int]:
    """Parse horovodrun's "server1:4,server2:4" into {host: slots}; check it adds up to n."""
    try:
        out = {h: int(k) for h, k in (part.rsplit(":", 1) for part in hosts.split(","))}
    except ValueError:
        raise ValueError(f"hosts={hosts!r}: write it as horovodrun does, e.g. 'server1:4,server2:4'") from None
    if sum(out.values()) != n:
        raise ValueError(f"hosts={hosts!r} has {sum(out.values())} slots but n={n}")
    if ip == LOCALHOST:
        raise ValueError("several hosts need ip= an address of this machine that they can reach "
                         "(servers then listen there instead of 127.0.0.1)")
    return out


def _find_mpiexec(mpiexec: str | None) -> str | None:
    if mpiexec:
        return mpiexec if os.access(mpiexec, os.X_OK) else None
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec")


_MPI_BUILT: dict[str, bool] = {}


def _horovod_has_mpi() -> bool:
    if "torch" not in _MPI_BUILT:
        _MPI_BUILT["torch"] = sysinfo.horovod_built()["torch.mpi"]
    return _MPI_BUILT["torch"]


def _check_args(n, backend, timeout, mpiexec):
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a whole number of engines >= 1, got {n!r}: e.g. kit.cluster.start(n=2)")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use backend='gloo' (no MPI needed) or backend='mpi'")
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if backend == "mpi":
        if _find_mpiexec(mpiexec) is None:
            raise ClusterError(f"backend='mpi' needs mpiexec ({mpiexec or 'none next to ' + sys.executable} "
                               "and none on PATH): run `make lab` to install Open MPI into .venv, or use "
                               "backend='gloo'")
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            raise ClusterError("backend='mpi' needs mpi4py: `pip install mpi4py` (make lab does), "
                               "or use backend='gloo'") from None
        if not _horovod_has_mpi():
            raise ClusterError("this Horovod was built without MPI: rebuild it with scripts/install_horovod.sh "
                               "(HOROVOD_WITH_MPI=1, mpicc on PATH), or use backend='gloo'")


def _gpu_plan(local_size: int, share_gpus: bool) -> list[str]:
    gpus = sysinfo.visible_gpus()
    if gpus and local_size > len(gpus) and not share_gpus:
        raise ClusterError(f"{local_size} engines per host but only {len(gpus)} GPU(s) visible: start at most "
                           f"{len(gpus)} engines, or pass share_gpus=True to put several engines on one GPU")
    return gpus


class _Rendezvous:
    """Horovod's own Gloo rendezvous server (the one `horovodrun --gloo` runs), bound to one address."""

    def __init__(self, addr: str):
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
        # RendezvousServer.start() listens on every interface; build its HTTP server on `addr` instead.
        self.httpd = RendezvousHTTPServer((addr, 0), RendezvousHandler, 0)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="kit-rendezvous")
        self.thread.start()

    def init(self, slots: list[Slot]):
        from horovod.runner.common.util.hosts import SlotInfo
        self.httpd.init([SlotInfo(s.hostname, s.rank, s.local_rank, s.cross_rank, s.size, s.local_size,
                                  s.cross_size) for s in sorted(slots, key=lambda s: s.rank)])

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


# ----------------------------------------------------------------------------------- run on the engines
def _engine_identity():
    import os
    import socket
    e = os.environ
    mpi = {k: int(e[v]) for k, v in (("rank", "OMPI_COMM_WORLD_RANK"), ("local_rank", "OMPI_COMM_WORLD_LOCAL_RANK"),
                                     ("local_size", "OMPI_COMM_WORLD_LOCAL_SIZE")) if v in e}
    return {"host": socket.gethostname(), "pid": os.getpid(), "mpi": mpi}


def _engine_setup(env):
    import os
    import sys
    early = [m for m in ("torch", "tensorflow", "horovod") if m in sys.modules]
    if early:
        raise RuntimeError(f"{early} were imported before kit.cluster set this engine up")
    os.environ.update(env)


def _engine_check_horovod():
    import horovod.torch as hvd
    import torch
    hvd.init()
    total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="kit.cluster.check").item()
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "sum": total}


def _engine_free_address():
    import socket
    with socket.socket() as s:
        s.bind(("", 0))
        return socket.gethostname(), s.getsockname()[1]


def _engine_init_process_group(init_method, timeout):
    import datetime
    import os
    import torch
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    rank, size = int(os.environ["KIT_RANK"]), int(os.environ["KIT_SIZE"])
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout))
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "size": dist.get_world_size(), "sum": t.item()}


# ----------------------------------------------------------------------------------- the notebook side
def _descendants() -> dict[int, float]:
    import psutil
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            out[p.pid] = p.create_time()
        except psutil.Error:
            pass
    return out


def _reap(procs: dict[int, float], grace: float = 5.0):
    """Terminate, then kill, every process in {pid: create_time} still alive (create_time guards pid reuse)."""
    import psutil
    alive = []
    for pid, created in procs.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 1e-3:
                alive.append(p)
        except psutil.Error:
            pass
    for p in alive:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)


class Cluster:
    """N engines as one job. Use `kit.cluster.start(...)` to make one."""

    def __init__(self, n=2, backend="gloo", *, timeout=DEFAULT_TIMEOUT, share_gpus=False, threads=None,
                 mpiexec=None, hosts=None, ip=LOCALHOST, quiet=False):
        _check_args(n, backend, timeout, mpiexec)
        self.hosts = parse_hosts(hosts, n, ip) if hosts else None
        if not self.hosts:
            _gpu_plan(n, share_gpus)  # all n engines on this host: fail before starting anything
        self.n, self.backend, self.timeout = n, backend, float(timeout)
        self.share_gpus, self.threads, self.mpiexec, self.ip, self.quiet = share_gpus, threads, mpiexec, ip, quiet
        self.client = self.view = self.slots = None
        self.dead: dict[int, str] = {}   # rank -> how it died (see poll_dead), first death first
        self._ipp = self._rendezvous = self._profile = None
        self._procs: dict[int, float] = {}
        self._pids: dict[int, int] = {}
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
        self._stopped, self.dead, self._procs, self._pids = False, {}, {}, {}
        self._before = _descendants()
        _LIVE.add(self)
        t0 = time.time()
        try:
            self._profile = tempfile.mkdtemp(prefix="kit-ipp-")
            self._ipp = ipp.Cluster(n=self.n, profile_dir=self._profile, controller_ip=self.ip,
                                    engine_timeout=int(max(60, self.timeout)), log_level=40, parent=None)
            if self.backend == "mpi":
                self._ipp.engine_launcher_class = "mpi"
                cfg = self._ipp.config.MPIEngineSetLauncher
                cfg.mpi_cmd = [_find_mpiexec(self.mpiexec)]
                # More ranks than cores needs --oversubscribe (the env-var form failed intermittently here).
                cfg.mpi_args = ["--oversubscribe"]
                # Open MPI refuses to run as root without these; set for the processes we start only.
                cfg.environment = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
                if self.hosts:
                    cfg.mpi_args += ["-H", ",".join(f"{h}:{k}" for h, k in self.hosts.items())]
                else:  # one host: MPI's own traffic stays on loopback too
                    cfg.environment.update(OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo")
            elif self.hosts:
                self._ipp.engine_launcher_class = "ssh"
                self._ipp.config.SSHEngineSetLauncher.engines = dict(self.hosts)
            self._ipp.start_cluster_sync(n=self.n)
            self.client = self._ipp.connect_client_sync()
            self.client.wait_for_engines(self.n, timeout=max(60, self.timeout), interactive=False)
            self._setup_engines()
            self._procs = self._new_processes()
            self._watch_engines()
            self._check_horovod()
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
        if self._stop_w is not None:
            try:
                os.write(self._stop_w, b"x")  # end the watcher thread (it closes its own fds)
            except OSError:
                pass
            os.close(self._stop_w)
            self._stop_w = None
        procs = dict(self._procs) or self._new_processes()  # start may have failed half-way
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass
        if self._ipp is not None:
            try:
                self._ipp.stop_cluster_sync()
            except Exception:
                pass
        # stop_cluster_sync() can return before every engine has exited (or leave mpiexec's children): reap.
        _reap(procs)
        if self._rendezvous is not None:
            self._rendezvous.stop()
            self._rendezvous = None
        if self._profile:
            shutil.rmtree(self._profile, ignore_errors=True)
        self.client = self.view = None

    def restart(self) -> "Cluster":
        """Stop everything and start a fresh job with the same settings (no kernel restart needed)."""
        self.stop()
        return self.start()

    def init_process_group(self) -> dict[int, int]:
        """Join every engine to one torch.distributed process group (gloo backend) with the Horovod ranks."""
        hosts = {s.hostname for s in self.slots.values()}
        if len(hosts) == 1:
            # One host: a FileStore rendezvous, so no TCP store server listens anywhere.
            path = os.path.join(self._profile, f"torch-dist-{time.time_ns()}")
            init_method = f"file://{path}"
        else:  # the TCP store listens on rank 0's host
            host, port = self.client[self.engine_of(0)].apply_sync(_engine_free_address)
            init_method = f"tcp://{host}:{port}"
        res = self.view.apply_async(_engine_init_process_group, init_method, self.timeout)
        out = self.wait(res)
        ranks = {eid: r["rank"] for eid, r in zip(self.view.targets, out)}
        bad = [r for r in out if r["size"] != self.n or r["sum"] != self.n]
        if bad or ranks != {e: s.rank for e, s in self.slots.items()}:
            raise ClusterError(f"torch.distributed group is not the expected one: {out}")
        return ranks

    def wait(self, async_result, timeout: float | None = None):
        """Return an AsyncResult's value; if an engine died, raise RankDiedError naming its rank."""
        from ipyparallel.error import CompositeError, EngineError
        try:
            return async_result.get(timeout=timeout)
        except (CompositeError, EngineError) as e:
            if self.poll_dead():
                raise self._died_error() from e
            raise

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
                self.dead[rank] = f"engine {self.engine_of(rank)} (pid {pid}) exited"
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
        info = dict(zip(ids, self.client[ids].apply_sync(_engine_identity)))
        if self.backend == "mpi":
            ids = sorted(ids, key=lambda e: info[e]["mpi"]["rank"])
        self.slots = assign_slots({e: info[e]["host"] for e in ids})
        if self.backend == "mpi":
            for e in ids:
                if self.slots[e].rank != info[e]["mpi"]["rank"]:
                    raise ClusterError(f"mpiexec placed ranks in an unexpected order: {info}")
        self._pids = {self.slots[e].rank: info[e]["pid"] for e in sorted(ids, key=lambda e: self.slots[e].rank)}
        local_size = max(s.local_size for s in self.slots.values())
        gpus = _gpu_plan(local_size, self.share_gpus)
        self._gpus = gpus
        self._threads = self.threads or max(1, sysinfo.cpu_cores() // local_size)
        envs = {e: engine_env(s, gpus=gpus, threads=self._threads, timeout=self.timeout)
                for e, s in self.slots.items()}
        if self.backend == "gloo":
            multi_host = len({s.hostname for s in self.slots.values()}) > 1
            self._rendezvous = _Rendezvous(self.ip)
            self._rendezvous.init(list(self.slots.values()))
            for e, s in self.slots.items():
                envs[e].update(gloo_env(s, addr=self.ip, port=self._rendezvous.port,
                                        iface=os.environ.get("HOROVOD_GLOO_IFACE", "") if multi_host else "lo"))
        else:
            for e in envs:
                envs[e].update({"HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "mpi"})
        pending = [self.client[e].apply_async(_engine_setup, envs[e]) for e in ids]
        for p in pending:
            p.get(timeout=self.timeout)
        self.view = self.client[[self.engine_of(r) for r in range(self.n)]]
        self.view.block = True
        if _in_ipython():
            self.view.activate()  # %%px / %px now target this job
            _install_ipython_hook()

    def _check_horovod(self):
        out = self.wait(self.view.apply_async(_engine_check_horovod), timeout=max(120, 2 * self.timeout))
        for eid, r in zip(self.view.targets, out):
            want = self.slots[eid]
            if r["size"] != self.n or r["rank"] != want.rank or r["sum"] != self.n:
                raise ClusterError(f"engine {eid}: Horovod says rank {r['rank']} of {r['size']} "
                                   f"(allreduce of ones = {r['sum']}), expected rank {want.rank} of {self.n}")

    def _watch_engines(self):
        """Note each engine's death the moment it happens (pidfd), so the first to die is named first."""
        if not hasattr(os, "pidfd_open"):
            return  # not Linux: poll_dead() still finds the dead, without their order
        import select
        fds, poller = {}, select.poll()
        for rank, pid in self._pids.items():
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            fds[fd] = rank
            poller.register(fd, select.POLLIN)
        stop_r, self._stop_w = os.pipe()
        poller.register(stop_r, select.POLLIN)

        def watch():
            try:
                while fds:
                    ready = [fd for fd, _ in poller.poll()]
                    if stop_r in ready:
                        return
                    for fd in ready:
                        rank = fds.pop(fd)
                        poller.unregister(fd)
                        self.dead.setdefault(rank, f"engine {self.engine_of(rank)} (pid {self._pids[rank]}) exited")
            finally:
                for fd in [*fds, stop_r]:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        threading.Thread(target=watch, daemon=True, name="kit-engine-watch").start()

    def _new_processes(self) -> dict[int, float]:
        return {p: c for p, c in _descendants().items() if p not in self._before}

    def _died_error(self) -> RankDiedError:
        (first, why), *rest = self.dead.items()
        then = f"; then rank(s) {', '.join(str(r) for r, _ in rest)} went down with it" if rest else ""
        return RankDiedError(f"rank {first} died ({why}){then}. The job is broken: run cluster.restart() for a "
                             "fresh one (no kernel restart needed).")

    def _summary(self, seconds):
        where = f"GPUs {','.join(self._gpus)}" if self._gpus else "CPU only (no GPU found)"
        same = all(e == s.rank for e, s in self.slots.items())
        return (f"kit.cluster: {self.n} engines as one {self.backend} job of size {self.n} "
                f"({'engine id = rank' if same else 'see cluster.rank_of(eid)'}), {where}, "
                f"{self._threads} thread(s) per engine, started in {seconds:.1f} s")


def _install_ipython_hook():
    """Make a %%px cell that failed because an engine died say which rank died and what to do."""
    from IPython import get_ipython
    from ipyparallel.error import CompositeError, EngineError

    def explain(shell, etype, value, tb, tb_offset=None):
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        for c in list(_LIVE):
            if c.poll_dead():
                print(f"kit.cluster: {c._died_error()}", file=sys.stderr)
    get_ipython().set_custom_exc((CompositeError, EngineError), explain)


def _in_ipython() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


_LIVE: set[Cluster] = set()   # started and not yet stopped: the kernel's exit stops them


@atexit.register
def _stop_all():
    """The kernel is exiting: stop every cluster it started."""
    for c in list(_LIVE):
        c.stop()


def start(n: int = 2, backend: str = "gloo", **kwargs) -> Cluster:
    """Start n engines as one Horovod job; return the Cluster (also usable as a context manager).

    kwargs: timeout (s, default 60: how long a collective waits for a dead peer), share_gpus (allow more
    engines than GPUs), threads (framework threads per engine; default cores // engines per host),
    mpiexec (path), hosts ("server1:4,server2:4": engines over MPI -H or ipyparallel SSH engines),
    ip (the address servers bind; default 127.0.0.1, needed otherwise with hosts), quiet.
    """
    return Cluster(n, backend, **kwargs).start()
