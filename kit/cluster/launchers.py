"""Ways of starting a cluster's engines, one small class each (used by ``kit.cluster``).

A launcher knows how its engines are started (ipyparallel's engine-set launcher and its options), how their
ranks are found, and what each engine must be told before it imports a framework; it owns the servers that
way needs (Gloo: Horovod's rendezvous server). The cluster's life cycle (start, check, watch, stop) is the same
for every launcher. A new way (e.g. remote hosts over SSH) is one new class in ``LAUNCHERS``.

    gloo: plain processes; Horovod's rendezvous server runs in the notebook's process and each engine gets its
          slot through HOROVOD_* variables, as `horovodrun --gloo` does.
    mpi:  `mpiexec` (the venv's Open MPI from PyPI) starts the engines; Horovod takes ranks from MPI.
"""
from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass

from kit import env, sysinfo
from kit.cluster import engines, loopback

LOCALHOST = "127.0.0.1"


class ClusterError(RuntimeError):
    """The cluster cannot start or a job on it failed; the message says what to do."""


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
    """Map engine id -> Slot: ranks grouped by host (hosts and engines in the order given), as horovodrun does."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    order = [hostnames[e] for e in hostnames]
    hosts = list(dict.fromkeys(order))
    plan = get_host_assignments(parse_hosts(",".join(f"{h}:{order.count(h)}" for h in hosts)), len(order))
    slots = {}
    for host in hosts:
        engines = [e for e in hostnames if hostnames[e] == host]
        host_slots = sorted((s for s in plan if s.hostname == host), key=lambda s: s.local_rank)
        for eid, s in zip(engines, host_slots):
            slots[eid] = Slot(host, s.rank, s.size, s.local_rank, s.local_size, s.cross_rank, s.cross_size)
    return slots


# The controller counts an engine in at its first heartbeat: every 3 s by default, so a start waited 1.5 s on
# average for it. Beat every 1 s, and allow 30 missed beats (the default 3 s x 10) before an engine is dropped.
HEARTBEAT = ["--HeartMonitor.period=1000", "--HeartMonitor.max_heartmonitor_misses=30"]


def bound(ipp_cluster, deadline: float):
    """Make `ipp_cluster`'s engine-set launcher start no engine after `deadline` (time.monotonic()): ipyparallel
    starts local and SSH engines one by one, and never stops for a timeout (an MPI set is one mpiexec)."""
    engine_set = ipp_cluster.engine_launcher_class
    one = getattr(engine_set, "launcher_class", None)
    if one is None:
        return

    def start(self, *args, **kwargs):
        if time.monotonic() > deadline:
            raise TimeoutError("kit.cluster.start: out of time before every engine was started")
        return one.start(self, *args, **kwargs)
    ipp_cluster.engine_launcher_class = type(f"Kit{engine_set.__name__}", (engine_set,),
                                             {"launcher_class": type(f"Kit{one.__name__}", (one,), {"start": start})})


def set_environment(config, tmp: str):
    """Give every process ipyparallel starts (controller, engines, mpiexec) TMPDIR=tmp (made here), torch.compile's
    caches in it (cache_env), and Python's fault handler: an engine that crashes (a signal, a C++ abort in a
    framework) writes the reason and its threads' stacks to its output, which a RankDiedError then quotes."""
    os.makedirs(tmp, exist_ok=True)
    extra = {"TMPDIR": tmp, "PYTHONFAULTHANDLER": "1", **engines.cache_env(tmp)}
    config.BaseLauncher.environment = dict(extra)
    for section in list(config.values()):
        if hasattr(section, "get") and isinstance(section.get("environment"), dict):
            section.environment = {**section.environment, **extra}


class Launcher:
    """One way of starting engines. The base class starts them as plain local processes."""
    name = ""

    def __init__(self, *, hosts: dict[str, int] | None = None, ip: str = LOCALHOST, mpiexec: str | None = None):
        self.hosts, self.ip, self.mpiexec = hosts, ip, mpiexec

    def check(self):
        """Raise ClusterError (saying what to do) if this way cannot work here; called before anything starts."""

    def configure(self, ipp_cluster):
        """Choose ipyparallel's engine-set launcher and its options on a not yet started ipp.Cluster."""

    def end_engines(self, procs: dict[int, int]):
        """Called by Cluster.stop() before ipyparallel's stop, with {pid: start time} of what the start made."""

    def wait_for_engines(self, client, n: int, timeout: float):
        """Wait until n engines have registered with the controller (TimeoutError after `timeout` s)."""
        client.wait_for_engines(n, timeout=timeout, interactive=False)

    def rank_order(self, info: dict[int, dict]) -> list[int]:
        """Return the engine ids in the order ranks are given ({eid: _engine_identity()})."""
        return sorted(info)

    def check_slots(self, slots: dict[int, Slot], info: dict[int, dict]):
        """Raise ClusterError if the slots disagree with how the engines were started."""

    def job_env(self, slots: dict[int, Slot]) -> dict[int, dict[str, str]]:
        """Start this way's servers; return what each engine must know about the job (engine id -> env)."""
        return {e: {} for e in slots}

    def lost_ranks(self, slots: dict[int, Slot]) -> dict[int, str]:
        """Return {rank: why} for ranks whose engine lives but cannot be reached (e.g. its host's link is down)."""
        return {}

    def lost_now(self, slots: dict[int, Slot], after: float) -> dict[int, str]:
        """Return {rank: why} for ranks whose host has not answered for `after` s (cheap; called while waiting)."""
        return {}

    def stop(self):
        """Stop the servers job_env started (idempotent)."""


# ----------------------------------------------------------------------------------- Gloo
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


def _handler():
    """Horovod's rendezvous handler, made safe for a second `hvd.init()` in the same engines (horovod.torch's, then
    horovod.tensorflow's, as notebook 00 does). Each rank writes its address as `rank_R` in each scope (Gloo), and
    `R`, and says it is through with `DELETE /scope/R` (Horovod's finalize). Upstream then deletes `R` but never
    `rank_R` in the scopes it adds per process set (nor anything in a scope of its plan when one rank's leaving
    is forgotten: `do_DELETE` clears every scope's list of leavers when one scope is complete), so the second
    rendezvous finds the first one's addresses, and a rank that reads a peer's old one before
    the peer wrote its new one ends in Gloo's "Connect timeout" abort, which kills the engine and then its peers
    (seen in CI: test_cluster's Keras allreduce after torch's; upstream as horovod/horovod#2839's occasional
    test_horovod_reinit abort). Here a rank that writes again in a scope it was through with starts a new round
    there: the keys (`rank_R` and `R`) of every rank that was through are dropped, so each rank waits for its
    peers' new addresses. Safe because no rank starts a second hvd.init() before the first has ended everywhere
    (the kit's start ends with an allreduce)."""
    from horovod.runner.http.http_server import RendezvousHandler

    class KitRendezvousHandler(RendezvousHandler):
        def do_PUT(self):
            parts = self.path.split("/")
            if len(parts) == 3:
                _, scope, key = parts
                rank = key.removeprefix("rank_")
                with self.server.cache_lock:
                    through = self.server.through.setdefault(scope, set())
                    if rank in through:         # this rank's next rendezvous here: every key of the last is old
                        keys = self.server.cache.get(scope, {})
                        for r in through:
                            keys.pop(f"rank_{r}", None)
                            keys.pop(r, None)
                        through.clear()
            super().do_PUT()

        def do_DELETE(self):
            parts = self.path.split("/")
            if len(parts) == 3:
                with self.server.cache_lock:
                    self.server.through.setdefault(parts[1], set()).add(parts[2])
            super().do_DELETE()         # upstream: its key R goes, or the whole scope once all are through

    return KitRendezvousHandler


class Rendezvous:
    """Horovod's own Gloo rendezvous server (the one `horovodrun --gloo` runs), bound to one address, with the
    handler above.

    It has no authentication (upstream's design: any process that reaches its port may read and write the job's
    keys, as under horovodrun), so it listens only on the cluster's `ip`: 127.0.0.1 on one host, the lab's address
    (or the `ip=` given) with several, never on every address as RendezvousServer.start() would."""

    def __init__(self, addr: str):
        from horovod.runner.http.http_server import RendezvousHTTPServer
        # RendezvousServer.start() listens on every interface; build its HTTP server on `addr` instead.
        self.httpd = RendezvousHTTPServer((addr, 0), _handler(), 0)
        self.httpd.through = {}                 # scope -> ranks through with its current round
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),   # stop() within 0.05 s
                                       daemon=True, name="kit-rendezvous")
        self.thread.start()

    def init(self, slots: list[Slot]):
        from horovod.runner.common.util.hosts import SlotInfo
        self.httpd.through = {}
        self.httpd.init([SlotInfo(s.hostname, s.rank, s.local_rank, s.cross_rank, s.size, s.local_size,
                                  s.cross_size) for s in sorted(slots, key=lambda s: s.rank)])

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


class GlooLauncher(Launcher):
    """Plain engine processes (ipyparallel's SSH launcher with hosts=) joined by Horovod's rendezvous server."""
    name = "gloo"
    rendezvous = None

    def configure(self, ipp_cluster):
        if self.hosts:
            ipp_cluster.engine_launcher_class = "ssh"
            ipp_cluster.config.SSHEngineSetLauncher.engines = dict(self.hosts)

    def end_engines(self, procs):
        if not self.hosts:      # SIGTERM every local engine at once: ipyparallel ends them one by one, ~1 s each
            engines.terminate(procs)

    def job_env(self, slots):
        multi_host = len({s.hostname for s in slots.values()}) > 1
        iface = os.environ.get("HOROVOD_GLOO_IFACE", "") if multi_host else "lo"
        self.rendezvous = Rendezvous(self.ip)
        self.rendezvous.init(list(slots.values()))
        return {e: gloo_env(s, addr=self.ip, port=self.rendezvous.port, iface=iface) for e, s in slots.items()}

    def stop(self):
        if self.rendezvous is not None:
            self.rendezvous.stop()
            self.rendezvous = None


# ----------------------------------------------------------------------------------- MPI
def find_mpiexec(mpiexec: str | None = None) -> str | None:
    """Return `mpiexec` if executable, else the venv's, else the one on PATH; None if there is none."""
    if mpiexec:
        return mpiexec if os.access(mpiexec, os.X_OK) else None
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec")


_MPI_BUILT: dict[str, bool] = {}


def horovod_has_mpi() -> bool:
    """Return whether this Horovod (torch) was built with MPI (probed once per process)."""
    if "torch" not in _MPI_BUILT:
        _MPI_BUILT["torch"] = sysinfo.horovod_built()["torch.mpi"]
    return _MPI_BUILT["torch"]


# Open MPI's settings for the engines (kit.env.MPI_ENV says why).
MPI_ENV = env.MPI_ENV


class MPILauncher(Launcher):
    """Engines started by `mpiexec` as one MPI job; Horovod's controller and operations use MPI."""
    name = "mpi"

    def check(self):
        if find_mpiexec(self.mpiexec) is None:
            raise ClusterError(f"backend='mpi' needs mpiexec ({self.mpiexec or 'none next to ' + sys.executable} "
                               "and none on PATH): run `make lab` to install Open MPI into .venv, or use "
                               "backend='gloo'")
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            raise ClusterError("backend='mpi' needs mpi4py: `pip install mpi4py` (make lab does), "
                               "or use backend='gloo'") from None
        if not horovod_has_mpi():
            raise ClusterError("this Horovod was built without MPI: rebuild it with scripts/install_horovod.sh "
                               "(HOROVOD_WITH_MPI=1, mpicc on PATH), or use backend='gloo'")

    def configure(self, ipp_cluster):
        ipp_cluster.engine_launcher_class = "mpi"
        cfg = ipp_cluster.config.MPIEngineSetLauncher
        cfg.mpi_cmd = [find_mpiexec(self.mpiexec)]
        # More ranks than cores needs --oversubscribe (the env-var form failed intermittently here).
        cfg.mpi_args = ["--oversubscribe"]
        cfg.environment = dict(MPI_ENV)
        if self.hosts:
            cfg.mpi_args += ["-H", ",".join(f"{h}:{k}" for h, k in self.hosts.items())]
        else:  # one host: MPI's messages go through shared memory; no TCP transport, so no listener of the ranks
            # (Open MPI's TCP transport binds 0.0.0.0 and :: whatever btl_tcp_if_include says, open-mpi/ompi#12668).
            # mpiexec's own (prterun's) listener still takes every address: `--prtemca prte_if_include lo` (or
            # oob_tcp_if_include) makes prterun refuse to start ("No network interfaces were found for out-of-band
            # communications"), oob_tcp_disable_ipv6 leaves [::]: open-mpi/ompi#14441, fixed in PRRTE after the
            # Open MPI 5.0.x that pip installs (openpmix/prrte#2788); tests/test_mpi_listeners.py notices the fix.
            # Until then a preload library binds mpiexec's (and the engines') wildcard listeners to loopback.
            cfg.environment.update(OMPI_MCA_btl="self,sm", **loopback.preload_env())

    def rank_order(self, info):
        return sorted(info, key=lambda e: info[e]["mpi"]["rank"])

    def check_slots(self, slots, info):
        if any(slots[e].rank != info[e]["mpi"]["rank"] for e in slots):
            raise ClusterError(f"mpiexec placed ranks in an unexpected order: {info}")

    def job_env(self, slots):
        return {e: {"HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "mpi"} for e in slots}


LAUNCHERS: dict[str, type[Launcher]] = {"gloo": GlooLauncher, "mpi": MPILauncher}


def launcher(backend: str, **kwargs) -> Launcher:
    """Return the launcher for `backend` (a key of LAUNCHERS); kwargs: hosts, ip, mpiexec."""
    if backend not in LAUNCHERS:
        raise ValueError(f"unknown backend {backend!r}: use backend='gloo' (no MPI needed) or backend='mpi'")
    return LAUNCHERS[backend](**kwargs)
