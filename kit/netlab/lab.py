"""A rack in one box: N emulated hosts with real, rate-limited network links, on one Linux machine (as root).

    with kit.netlab.start(hosts=4, rate="1gbit") as lab:      # h1..h4, each its own hostname, address and NIC
        lab.ssh("h1", "hostname").stdout                      # 'h1\\n' (an OpenSSH server runs on every host)
        lab.measure_rate("h1", "h2")                          # {'h1->h2': 1.25e8, 'h2->h1': 1.25e8} bytes/s
        lab.set_rate("100mbit"); lab.cut("h2"); lab.restore("h2")

Each host is a network namespace (plus a UTS namespace for its hostname) with one veth NIC `eth0` plugged into
one bridge (the switch); this machine's side of the bridge has the address `lab.addr`. A token-bucket filter
(`tc ... tbf`) on the egress of BOTH ends of every veth limits each direction to `rate`. Addresses come from the
benchmark range 198.18.0.0/15 only. Every resource is named `kitlab<L>-...` (L: the lab's number), so that
`stop()`, `with`, atexit, and the next `start()` after a crash (a sweep of labs whose owner process is gone)
leave nothing behind (kit/netlab/registry.py). The SSH side (keys, sshd, client config) is in kit/netlab/ssh.py.

A stopped lab refuses: every method of it raises a LabError saying when it was stopped, so that a kept handle
never acts on a newer lab that got the same number; and every method checks that the lab's owner record still
holds the token this lab wrote at its start (another process's lab of the same number would not).
"""
from __future__ import annotations

import atexit
import functools
import os
import secrets
import subprocess
import time

from kit import scratch
from kit.netlab import rate as netlab_rate
from kit.netlab import registry
from kit.netlab import ssh as netlab_ssh
from kit.netlab.registry import PREFIX, MAX_LABS, _kit_resources, names, ns_pids, _kill_all
from kit.netlab.requirements import check_requirements
from kit.netlab.system import LabError, check_host_count, check_seconds, parse_rate, run


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _live(method):
    """Make `method` refuse on a stopped lab, or on one whose owner record is no longer its own."""
    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        self._check()
        return method(self, *args, **kwargs)
    return checked


class Lab:
    """N emulated hosts h1..hN on one bridge; made by `start()`, removed by `stop()` (or `with`, or atexit)."""

    def __init__(self, lab_id: int, hosts: int, rate: str, dir_: str, token: str = "", started_at: float = 0.0):
        self.id, self.dir, self.rate = lab_id, dir_, rate
        self._n = names(lab_id, hosts)
        self.hosts = [f"h{i}" for i in range(1, hosts + 1)]
        self.addr = self._n["addr"]
        self.bridge = self._n["bridge"]
        self.ssh_config = os.path.join(dir_, "ssh_config")
        self._sshd: dict[str, subprocess.Popen] = {}
        self._keep: dict[int, int | None] = {}      # {pid: start} kill_jobs() spares besides sshd (lab.keep)
        self._on_stop: list = []                     # called first by stop() (lab.on_stop)
        self._token, self._started_at = token, started_at or time.time()
        self._stopping = False
        self._stopped_at: float | None = None

    def __repr__(self):
        state = f", stopped at {_clock(self._stopped_at)}" if self._stopped_at else ""
        return f"<Lab {self.id}: {', '.join(self.hosts)} on {self.bridge} {self.addr}/24, {self.rate}{state}>"

    def _name(self) -> str:
        return f"this lab ({PREFIX}{self.id}, started at {_clock(self._started_at)})"

    def _check(self):
        """Raise LabError if this lab was stopped, or its number now belongs to another lab (its record's token)."""
        if self._stopped_at is not None:
            raise LabError(f"{self._name()} was stopped at {_clock(self._stopped_at)}; start a new one with "
                           f"kit.netlab.start()")
        if self._stopping:
            return                                  # stop()'s own steps act on what is still this lab's
        record = registry.read_record(registry.record_path(self.id)) or {}
        if record.get("token") != self._token:
            raise LabError(f"{self._name()} is no longer registered in {registry.record_path(self.id)} (another "
                           f"process removed it, or a newer lab has its number): it acts on nothing; start a new "
                           f"one with kit.netlab.start()")

    @_live
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def _index(self, host: str) -> int:
        if not isinstance(host, str) or host not in self.hosts:
            raise LabError(f"no host {host!r} in this lab: its hosts are {self.hosts}")
        return self.hosts.index(host)

    @_live
    def ns(self, host: str) -> str:
        """Return the network namespace of `host` (for `ip netns exec NS ...`)."""
        return self._n["ns"][self._index(host)]

    @_live
    def addr_of(self, host: str) -> str:
        """Return the address of `host` on the lab's bridge."""
        return self._n["host_addr"][self._index(host)]

    @_live
    def veth(self, host: str) -> str:
        """Return the name of `host`'s link on this machine's side of the bridge."""
        return self._n["veth"][self._index(host)]

    @_live
    def exec_cmd(self, host: str, *cmd: str) -> list[str]:
        """Return the command line that runs `cmd` on `host` with its hostname (no SSH: for the kit's own tools)."""
        return ["ip", "netns", "exec", self.ns(host), "unshare", "--uts", "sh", "-c",
                f'hostname {host} && exec "$@"', "sh", *cmd]

    # ---------------------------------------------------------------------------------- build and tear down
    def _build(self):
        n = self._n
        run("ip", "link", "add", n["bridge"], "type", "bridge")
        run("ip", "addr", "add", f"{self.addr}/24", "dev", n["bridge"])
        run("ip", "link", "set", n["bridge"], "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{a} {h}\n" for h, a in zip(self.hosts, n["host_addr"])) + f"{self.addr} {PREFIX}{self.id}-root\n"
        for host, ns, veth, addr in zip(self.hosts, n["ns"], n["veth"], n["host_addr"]):
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(hosts_file)
            run("ip", "netns", "add", ns)
            run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            run("ip", "link", "set", veth, "master", n["bridge"], "up")
            run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        self.set_rate(self.rate)
        for host in self.hosts:
            self._sshd[host] = netlab_ssh.start_sshd(self, host)
        netlab_ssh.wait_ready(self)

    def stop(self):
        """Remove everything this lab made: processes on its hosts, sshd, namespaces, links, keys, dirs. Once
        stopped, every other method of the lab raises (a second stop() does nothing)."""
        if self._stopping or self._stopped_at is not None:
            return
        self._stopping = True
        try:
            for hook in list(self._on_stop):
                try:
                    hook()
                except Exception:             # what it left runs in the lab's namespaces: removed below
                    pass
            self._kill_jobs()                 # sessions and what they started first, so sshd reaps them
            for p in self._sshd.values():
                p.terminate()
            for p in self._sshd.values():
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=10)
            res = _kit_resources().get(self.id, {})
            if (registry.read_record(registry.record_path(self.id)) or {}).get("token") != self._token:
                res.pop("owner", None)        # not this lab's record any more: another lab's, left alone
            registry._remove(res)
        finally:
            self._stopped_at = time.time()
            _LABS.discard(self)
        with registry.lock():                  # the owners' folder goes with the last lab, not while one starts
            try:
                os.rmdir(registry.OWNERS)
            except OSError:
                pass

    def _job_pids(self) -> dict[str, set[int]]:
        keep = {p.pid for p in self._sshd.values()} | {p for p, t in self._keep.items() if scratch.started(p) == t}
        return {h: ns_pids(self._n["ns"][i]) - keep for i, h in enumerate(self.hosts)}

    @_live
    def job_pids(self) -> dict[str, set[int]]:
        """Return {host: pids} of what runs on each host but its SSH server and the kept daemons: jobs."""
        return self._job_pids()

    def jobs_left(self, seconds: float = 20) -> dict[str, set[int]]:
        """Wait up to `seconds` for the jobs on the lab's hosts to end (a killed process may take a moment to go);
        return {host: pids} of the hosts where some still run, {} when none does."""
        check_seconds("seconds", seconds, zero=True)
        deadline = time.monotonic() + seconds
        while (left := {h: p for h, p in self.job_pids().items() if p}) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def _kill_jobs(self):
        for pids in self._job_pids().values():
            _kill_all(pids)

    @_live
    def kill_jobs(self):
        """Kill everything running on the lab's hosts but their SSH servers and kept daemons (a job gone wrong)."""
        self._kill_jobs()

    @_live
    def keep(self, pids):
        """Spare processes `pids` (e.g. Slurm's daemons) in kill_jobs() and job_pids(), as sshd is spared: each
        pid with its start time, so a pid reused after the process ended is not spared."""
        pids = [pids] if isinstance(pids, int) else list(pids)
        if not all(isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in pids):
            raise LabError(f"pids={pids!r}: give process ids (positive ints)")
        self._keep.update({p: scratch.started(p) for p in pids})

    @_live
    def on_stop(self, fn):
        """Call `fn()` first when the lab stops (stop(), `with`, atexit), while the lab is still whole; return fn."""
        if not callable(fn):
            raise LabError(f"fn={fn!r}: give a function to call when the lab stops")
        self._on_stop.append(fn)
        return fn

    # ------------------------------------------------------------------------------------------- operations
    @_live
    def set_rate(self, rate: str):
        """Limit every link to `rate` in each direction (tbf on the egress of both ends of every veth)."""
        bits = parse_rate(rate)
        burst = max(int(bits / 8 * 0.002), 64 * 1024)       # 2 ms of traffic, at least one 64 KB GSO packet
        args = ["root", "tbf", "rate", f"{int(bits)}bit", "burst", str(burst), "latency", "50ms"]
        for host in self.hosts:
            run("tc", "qdisc", "replace", "dev", self.veth(host), *args)
            run("tc", "-n", self.ns(host), "qdisc", "replace", "dev", "eth0", *args)
        self.rate = rate

    @_live
    def cut(self, host: str):
        """Pull `host`'s cable: its link goes down (packets to and from it are lost until `restore`)."""
        run("ip", "link", "set", self.veth(host), "down")

    @_live
    def restore(self, host: str):
        """Plug `host`'s cable back in."""
        run("ip", "link", "set", self.veth(host), "up")

    @_live
    def ssh(self, host: str, cmd: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """Run shell command `cmd` on `host` over SSH with the lab's key and config; return the finished process."""
        self._index(host)
        if not isinstance(cmd, str):
            raise LabError(f"cmd={cmd!r}: give one shell command line as a string")
        check_seconds("timeout", timeout)
        p = subprocess.run(netlab_ssh.ssh_cmd(self, host, cmd), capture_output=True, text=True, timeout=timeout)
        if check and p.returncode:
            raise LabError(f"ssh {host} {cmd!r} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
        return p

    @_live
    def launch(self, host: str, argv: list[str], cwd: str | None = None, env: dict | None = None,
               **popen_kw) -> subprocess.Popen:
        """Start `argv` on `host` over SSH in `cwd` (default: here) with `launch_env(**env)` (e.g. horovodrun)."""
        self._index(host)
        if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
            raise LabError(f"argv={argv!r}: give the command as a non-empty list of strings")
        line = netlab_ssh.remote_command(self, argv, cwd or os.getcwd(), self.launch_env(**(env or {})))
        return subprocess.Popen(netlab_ssh.ssh_cmd(self, host, line), stdin=subprocess.DEVNULL, **popen_kw)

    @_live
    def launch_env(self, **extra) -> dict[str, str]:
        """Return what launchers on lab hosts need: the lab's ssh first on PATH, a lab HOME, Open MPI as root."""
        return netlab_ssh.launch_env(self, **extra)

    @_live
    def horovodrun_args(self, slots: int = 1, hosts: list[str] | None = None) -> list[str]:
        """Return `-np N -H h1:S,h2:S --network-interface eth0` for horovodrun started on a lab host."""
        return netlab_ssh.horovodrun_args(self, slots, hosts)

    @_live
    def mpi_args(self, slots: int = 1, hosts: list[str] | None = None) -> list[str]:
        """Return mpiexec's `-np -H`, the lab's ssh as Open MPI's agent and the variables to carry to each host."""
        return netlab_ssh.mpi_args(self, slots, hosts)

    @_live
    def measure_rate(self, a: str, b: str, seconds: float = 3.0) -> dict[str, float]:
        """Stream bytes over a TCP socket a->b, then b->a; return what each receiver got, in bytes/s."""
        self._index(a), self._index(b)
        if a == b:
            raise LabError(f"a={a!r}, b={b!r}: give two different hosts of {self.hosts}")
        check_seconds("seconds", seconds, high=600)
        return {f"{a}->{b}": netlab_rate.stream(self, a, b, seconds),
                f"{b}->{a}": netlab_rate.stream(self, b, a, seconds)}


_LABS: set[Lab] = set()        # strong references: a lab nobody holds is still stopped at exit


@atexit.register
def _stop_all():
    for lab in list(_LABS):
        lab.stop()


def start(hosts: int = 4, rate: str = "1gbit") -> Lab:
    """Start a lab of `hosts` emulated hosts h1..hN, every link limited to `rate` each way; return the Lab."""
    check_host_count(hosts)
    parse_rate(rate)
    check_requirements()
    with registry.lock():                    # two labs starting at once must not pick the same number
        registry.owners_dir(create=True)     # checked before anything is made
        registry.sweep()
        used = set(_kit_resources())
        free = [i for i in range(MAX_LABS) if i not in used]
        if not free:
            raise LabError(f"{MAX_LABS} labs are running already: stop one (lab.stop())")
        dir_ = registry.make_dir(free[0])
        token, at = secrets.token_hex(16), time.time()
        registry.write_record(free[0], {"pid": os.getpid(), "start": scratch.started(os.getpid()), "dir": dir_,
                                        "token": token, "at": at})
        lab = Lab(free[0], hosts, rate, dir_, token, at)
        _LABS.add(lab)
        scratch.end_with_process(_stop_all)     # SIGTERM, SIGHUP: stopped as at exit
    try:
        netlab_ssh.make_keys(lab)
        lab._build()
    except BaseException:
        lab.stop()
        raise
    return lab
