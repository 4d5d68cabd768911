"""Engines on other hosts (used by ``kit.cluster`` when it is given ``hosts=``): over SSH, as a real cluster does.

    cluster = kit.cluster.start(n=4, backend="gloo", hosts=lab)           # a kit.netlab lab: h1:2,h2:2
    cluster = kit.cluster.start(n=4, backend="gloo", hosts="server1:2,server2:2", ip="10.0.0.5")

gloo: ipyparallel's own SSH engine launcher (`SSHEngineSetLauncher`) starts each engine with
      `ssh HOST python -m ipyparallel.engine`; its `ssh_cmd` is a list, so the lab's `ssh -F LAB/ssh_config`
      goes in as it is (no wrapper needed). Horovod's rendezvous server listens on `ip` in the notebook's process.
mpi:  `mpiexec -H h1:2,h2:2` run on the first host over ssh, with Open MPI's `plm_rsh_agent` = that same ssh;
      MPI's traffic stays on `ip`'s subnet.
Both: the engines run this Python (a shared file system, as on a cluster's NFS home) with this kit on
PYTHONPATH; the Gloo interface of each host is the one its route to `ip` leaves by (`ip route get`, over SSH).
"""
from __future__ import annotations

import ipaddress
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kit import env as kit_env
from kit import scratch
from kit.cluster import engines
from kit.cluster.checks import Hosts
from kit.cluster.launchers import LOCALHOST, ClusterError, GlooLauncher, MPILauncher, gloo_env

KIT_ROOT = kit_env.KIT_ROOT      # holds `kit`
IPP_VARS = ("IPP_CONNECTION_INFO", "IPP_CLUSTER_ID", "IPP_PROFILE_DIR")
CARRY = ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS", "KIT_DATA_DIR", "HOROVOD_TIMELINE")


@dataclass
class Remote:
    """How to reach the hosts: the ssh command line and the variables every remote process gets."""
    ssh: list[str] = field(default_factory=lambda: ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"])
    scp: list[str] = field(default_factory=lambda: ["scp", "-o", "BatchMode=yes"])
    agent: str = "ssh"                       # Open MPI's plm_rsh_agent: one word (a program on PATH or a path)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        path = os.environ.get("PYTHONPATH", "")
        if KIT_ROOT not in path.split(os.pathsep):          # the engines import this very kit
            path = os.pathsep.join(p for p in (KIT_ROOT, path) if p)
        carry = {k: os.environ[k] for k in CARRY if k in os.environ}
        self.env = {**carry, "PYTHONPATH": path, **self.env}

    def run(self, host: str, cmd: str, timeout: float = 30, connect: int = 5) -> subprocess.CompletedProcess:
        """Run shell command `cmd` on `host`; return the finished process (never raises for a failed command)."""
        try:
            return subprocess.run([*self.ssh, "-o", f"ConnectTimeout={connect}", host, cmd], capture_output=True,
                                  text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(cmd, 255, "", f"no answer within {timeout:.0f} s")


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




def launcher_for(backend: str, hosts: str | Hosts, n: int, ip: str, mpiexec: str | None):
    """Return ({host: slots}, the address servers bind, the launcher) for engines on `hosts`: horovodrun's
    "server1:4,server2:4" (with ip=), or a kit.netlab lab or other Hosts (n // len(lab.hosts) engines on each)."""
    how = None
    if not isinstance(hosts, str):
        hosts, ip, how = from_lab(hosts, n)
    slots = parse_hosts(hosts, n, ip)
    return slots, ip, REMOTE_LAUNCHERS[backend](hosts=slots, ip=ip, mpiexec=mpiexec, remote=how)


def from_lab(lab: Hosts, n: int) -> tuple[str, str, Remote]:
    """Return (hosts "h1:2,h2:2", the address servers bind, how to reach the hosts) for n engines on a lab."""
    k, extra = divmod(n, len(lab.hosts))
    if extra or not k:
        raise ValueError(f"n={n} engines do not split evenly over the lab's {len(lab.hosts)} hosts: use n = "
                         f"a multiple of {len(lab.hosts)}, or hosts='h1:3,h2:2', ip=lab.addr")
    ssh = ["ssh", "-F", lab.ssh_config]
    remote = Remote(ssh=ssh, scp=["scp", "-F", lab.ssh_config], agent=os.path.join(lab.dir, "bin", "ssh"),
                    env={k: v for k, v in lab.launch_env().items() if k not in ("PATH",)})
    return ",".join(f"{h}:{k}" for h in lab.hosts), lab.addr, remote


SLOW = re.compile(r"timed out|no answer within")    # a host too busy to answer in time: ask again


def check_hosts(remote: Remote, hosts, tries: int = 3) -> dict[str, str]:
    """Return {host: why} for every host that does not answer over SSH (all probed at once). A host that timed out
    (on a loaded machine sshd can miss the banner exchange's time limit) is asked again, up to `tries` times in all;
    one that refuses or does not resolve is reported at once."""
    down, pending = {}, list(hosts)
    for _ in range(tries):
        with ThreadPoolExecutor(max(1, len(pending))) as pool:
            answers = dict(zip(pending, pool.map(lambda h: remote.run(h, "true", timeout=30, connect=10), pending)))
        for h, p in answers.items():
            if p.returncode:
                down[h] = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
            else:
                down.pop(h, None)
        pending = [h for h, why in down.items() if SLOW.search(why)]
        if not pending:
            break
    return down


def ssh_address(remote: Remote, host: str) -> tuple[str, int]:
    """Return the (address, port) ssh connects to for `host`, per its configuration (`ssh -G`, no connection)."""
    cache = remote.__dict__.setdefault("_addresses", {})
    if host not in cache:
        out = subprocess.run([*remote.ssh, "-G", host], capture_output=True, text=True, timeout=10).stdout
        conf = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        cache[host] = (conf.get("hostname", host), int(conf.get("port", 22)))
    return cache[host]


def port_answers(addr: str, port: int, timeout: float = 2.0) -> bool:
    """Return whether `addr`:`port` accepts a TCP connection within `timeout` s (is the host's SSH server there?)."""
    import socket
    try:
        socket.create_connection((addr, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def route_iface(remote: Remote, host: str, addr: str) -> str:
    """Return the interface by which `host` reaches `addr` (what Gloo must use there), from `ip route get`."""
    p = remote.run(host, f"ip -o route get {shlex.quote(addr)}")
    m = re.search(r"\bdev (\S+)", p.stdout)
    if not m:
        raise ClusterError(f"cannot tell which interface {host} uses to reach {addr} "
                           f"(`ip route get {addr}` there: {(p.stderr or p.stdout).strip()[-200:]})")
    return m.group(1)


def local_subnet(addr: str) -> str:
    """Return the subnet (CIDR) of this machine's interface that carries `addr` (for Open MPI's if_include)."""
    import psutil
    for nics in psutil.net_if_addrs().values():
        for a in nics:
            if a.address == addr and a.netmask:
                return str(ipaddress.ip_interface(f"{addr}/{a.netmask}").network)
    raise ClusterError(f"ip={addr} is not an address of this machine: give the address of the interface "
                       "that the hosts reach (e.g. lab.addr)")


class _RemoteMixin:
    """What both remote launchers share: the SSH check, rank order by host, lost hosts, clean-up."""
    remote: Remote
    profile_dir = None
    _down_since: dict[str, float] | None = None      # host -> when it first did not answer (see lost_now)

    def check(self):
        super().check()
        down = check_hosts(self.remote, list(self.hosts))
        if down:
            raise ClusterError("cannot reach " + "; ".join(f"{h} over SSH ({why})" for h, why in down.items()) +
                           ": is the host up and its SSH server running? Nothing was started.")

    def rank_order(self, info):
        order = list(self.hosts)
        return sorted(info, key=lambda e: (order.index(info[e]["host"]) if info[e]["host"] in order else
                                           len(order), e))

    def lost_now(self, slots, after: float, every: float = 3.0) -> dict[int, str]:
        """Every `every` s, try a TCP connection to each host's SSH port (2 s at most, in parallel); return the
        ranks of hosts that have not answered for `after` s: a cut link is named without waiting for Gloo."""
        now = time.monotonic()
        if now < getattr(self, "_next_probe", 0):
            return {}
        self._next_probe, self._down_since = now + every, self._down_since or {}
        hosts = sorted({s.hostname for s in slots.values()})
        with ThreadPoolExecutor(len(hosts)) as pool:
            up = dict(zip(hosts, pool.map(lambda h: port_answers(*ssh_address(self.remote, h)), hosts)))
        for h in hosts:
            if up[h]:
                self._down_since.pop(h, None)
            else:
                self._down_since.setdefault(h, now)
        lost = {h: now - t for h, t in self._down_since.items() if now - t >= after}
        return {s.rank: f"host {s.hostname} unreachable: its SSH port has not answered for {lost[s.hostname]:.0f} s"
                for s in slots.values() if s.hostname in lost}

    def lost_ranks(self, slots) -> dict[int, str]:
        down = check_hosts(self.remote, sorted({s.hostname for s in slots.values()}))
        return {s.rank: f"host {s.hostname} unreachable: {down[s.hostname]}"
                for s in slots.values() if s.hostname in down}

    def stop(self):
        super().stop()
        self._down_since, self._next_probe = {}, 0
        if self.profile_dir:       # engines this cluster started that are still up (e.g. behind a cut link)
            engines.reap(_processes_mentioning(self.profile_dir))


def _processes_mentioning(text: str) -> dict[int, int]:
    """Return {pid: start time} of the processes whose command line contains `text`, and their MPI daemons."""
    import psutil
    out = {}
    for p in psutil.process_iter(["cmdline"]):
        if p.pid != os.getpid() and text in " ".join(p.info["cmdline"] or []):
            out[p.pid] = scratch.started(p.pid)
            try:
                parent = p.parent()
                if parent and parent.name().startswith(("prted", "orted")):
                    out[parent.pid] = scratch.started(parent.pid)
            except psutil.Error:
                pass
    return {pid: t for pid, t in out.items() if t is not None}


def ssh_engine_set_launcher():
    """Return ipyparallel's engine-set launcher for engines started by one `ssh HOST exec python ...` each."""
    global _SSH_ENGINES
    if _SSH_ENGINES is None:
        from ipyparallel.cluster.launcher import LocalEngineLauncher, LocalEngineSetLauncher
        from traitlets import Dict, List

        class KitSSHEngineLauncher(LocalEngineLauncher):
            """One engine: a local `ssh -tt HOST exec env VARS python -m ipyparallel.engine ...` (killing it
            ends the remote session, so the engine gets SIGHUP)."""
            def find_args(self):
                host = self.parent.host_of[int(self.identifier)]
                env = shlex.join(f"{k}={v}" for k, v in self.get_env().items())
                return [*self.parent.ssh, "-tt", host, f"exec env {env} {shlex.join(super().find_args())}"]

        class KitSSHEngineSetLauncher(LocalEngineSetLauncher):
            launcher_class = KitSSHEngineLauncher
            engines = Dict(config=True, help="{host: number of engines}, in rank order")
            ssh = List(config=True, help="the ssh command line (e.g. ssh -F LAB/ssh_config)")

            @property
            def host_of(self):
                return [h for h, k in self.engines.items() for _ in range(k)]

        _SSH_ENGINES = KitSSHEngineSetLauncher
    return _SSH_ENGINES


_SSH_ENGINES = None


def head_mpi_engine_set_launcher():
    """Return ipyparallel's MPI engine-set launcher with `mpiexec` run on the first host over SSH."""
    global _HEAD_MPI
    if _HEAD_MPI is None:
        from ipyparallel.cluster.launcher import MPIEngineSetLauncher
        from traitlets import List, Unicode

        class KitHeadMPIEngineSetLauncher(MPIEngineSetLauncher):
            """`ssh -tt HEAD cd DIR && exec env VARS mpiexec ...`: the job's mpiexec runs on its first host, as a
            batch script does on a cluster's first node (killing the ssh ends the remote session)."""
            head = Unicode(config=True, help="the host mpiexec runs on")
            ssh = List(config=True, help="the ssh command line (e.g. ssh -F LAB/ssh_config)")

            def find_args(self):
                env = shlex.join(f"{k}={v}" for k, v in self.get_env().items())
                line = f"cd {shlex.quote(self.work_dir)} && exec env {env} {shlex.join(super().find_args())}"
                return [*self.ssh, "-tt", self.head, line]

        _HEAD_MPI = KitHeadMPIEngineSetLauncher
    return _HEAD_MPI


_HEAD_MPI = None


class SSHGlooLauncher(_RemoteMixin, GlooLauncher):
    """Engines started over SSH (one `ssh HOST exec python -m ipyparallel.engine` each, all at once), joined by
    Horovod's rendezvous server on `ip`.

    Not ipyparallel's own SSHEngineSetLauncher: it takes the lab's ssh config (its ssh_cmd is a list) and ran
    this job correctly, but it opens 3-4 SSH sessions per engine one engine after the other, each starting a
    Python (shell probe, `IPython profile create`, a start wrapper), and fetches logs with scp, whose SFTP mode
    the lab's sshd does not serve: 100 s to start 4 engines on this (loaded, 2-core) machine.
    """

    def __init__(self, *, remote: Remote | None = None, **kwargs):
        super().__init__(**kwargs)
        self.remote = remote or Remote()

    def configure(self, ipp_cluster):
        self.profile_dir = ipp_cluster.profile_dir
        cls = ssh_engine_set_launcher()
        ipp_cluster.engine_launcher_class = cls
        cfg = ipp_cluster.config[cls.__name__]
        cfg.engines, cfg.ssh = dict(self.hosts), list(self.remote.ssh)
        cfg.engine_cmd = [sys.executable, "-m", "ipyparallel.engine"]
        cfg.environment = dict(self.remote.env)

    def job_env(self, slots):
        hosts = sorted({s.hostname for s in slots.values()})
        with ThreadPoolExecutor(len(hosts)) as pool:
            iface = dict(zip(hosts, pool.map(lambda h: route_iface(self.remote, h, self.ip), hosts)))
        env = super().job_env(slots)
        for e, s in slots.items():
            env[e].update(gloo_env(s, addr=self.ip, port=self.rendezvous.port, iface=iface[s.hostname]))
        return env


class SSHMPILauncher(_RemoteMixin, MPILauncher):
    """Engines started by `mpiexec -H`, whose daemons reach the hosts with the same ssh.

    mpiexec itself runs on the first host (over the same ssh), not on the notebook's machine: Open MPI 5's
    mpiexec (prterun) binds its daemon-control listener to every address of the machine it runs on, whatever
    `oob_tcp_if_include` says (tried --mca, --prtemca, PRTE_MCA_*); there it listens on that host's network, not
    on every network of the notebook's machine."""

    def __init__(self, *, remote: Remote | None = None, **kwargs):
        super().__init__(**kwargs)
        self.remote = remote or Remote()

    def configure(self, ipp_cluster):
        self.profile_dir = ipp_cluster.profile_dir
        super().configure(ipp_cluster)
        cls = head_mpi_engine_set_launcher()
        ipp_cluster.engine_launcher_class = cls
        head = ipp_cluster.config[cls.__name__]
        head.head, head.ssh = next(iter(self.hosts)), list(self.remote.ssh)
        cfg = ipp_cluster.config.MPIEngineSetLauncher
        subnet = local_subnet(self.ip)
        env = {**cfg.environment, **self.remote.env}
        cfg.environment = env
        # --map-by slot: fill h1's slots, then h2's (with --oversubscribe alone Open MPI 5 put all 4 on h1 here)
        cfg.mpi_args = [*cfg.mpi_args, "--map-by", "slot", "--prefix", sys.prefix,
                        "--mca", "plm_rsh_agent", self.remote.agent,
                        "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet,
                        "--mca", "mpi_yield_when_idle", "1",
                        # Open MPI hands remote ranks only the variables named with -x (ipyparallel's included)
                        *[a for k in [*env, *IPP_VARS] for a in ("-x", k)]]


REMOTE_LAUNCHERS = {"gloo": SSHGlooLauncher, "mpi": SSHMPILauncher}
