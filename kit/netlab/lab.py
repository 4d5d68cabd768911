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
leave nothing behind. The SSH side (keys, sshd, client config) is in kit/netlab/ssh.py.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from kit.netlab import rate as netlab_rate
from kit.netlab import ssh as netlab_ssh
from kit.netlab.requirements import check_requirements
from kit.netlab.system import LabError, parse_rate, run

PREFIX = "kitlab"
NAME_RE = re.compile(rf"^{PREFIX}(\d+)-")
MAX_LABS = 64
LOCK = f"/run/{PREFIX}.lock"
# Who owns each lab, in one place every process on the machine sees whatever its TMPDIR (a notebook kernel, a
# shell and `make test` each have their own): /run/kitlab/kitlab<N>-owner.json = {pid, start, dir}.
OWNERS = f"/run/{PREFIX}"


# ------------------------------------------------------------------------------------ names and sweeping
def names(lab_id: int, hosts: int) -> dict:
    """Return the kernel names and addresses of lab `lab_id` (198.18.<lab_id>.0/24; this machine is .1)."""
    base = f"198.18.{lab_id}"
    return {"bridge": f"{PREFIX}{lab_id}-br", "addr": f"{base}.1",
            "ns": [f"{PREFIX}{lab_id}-h{i}" for i in range(1, hosts + 1)],
            "veth": [f"{PREFIX}{lab_id}-v{i}" for i in range(1, hosts + 1)],
            "host_addr": [f"{base}.{10 + i}" for i in range(1, hosts + 1)]}


def _kit_resources() -> dict[int, dict[str, list[str]]]:
    """Return every kitlab resource on this machine, by lab number: namespaces, links, /etc/netns dirs, temp dirs."""
    found: dict[int, dict[str, list[str]]] = {}

    def add(kind, name, key=None):
        m = NAME_RE.match(key or name)
        if m:
            found.setdefault(int(m.group(1)), {}).setdefault(kind, []).append(name)
    for line in run("ip", "netns", "list").stdout.splitlines():
        add("ns", line.split()[0])
    for line in run("ip", "-o", "link", "show").stdout.splitlines():
        add("link", line.split(":")[1].strip().split("@")[0])
    for d in glob.glob(f"/etc/netns/{PREFIX}*"):
        add("etc", d, os.path.basename(d))
    for d in glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}*-*")):
        add("tmp", d, os.path.basename(d))
    for record in glob.glob(os.path.join(OWNERS, f"{PREFIX}*-owner.json")):
        add("owner", record, os.path.basename(record))
        try:                                    # the lab's dir, in its owner's temp dir (not necessarily ours)
            d = json.load(open(record))["dir"]
        except (OSError, ValueError, KeyError):
            continue
        if os.path.isdir(d):
            add("tmp", d, os.path.basename(d))
    for res in found.values():
        if "tmp" in res:
            res["tmp"] = sorted(set(res["tmp"]))
    return found


def live_owner(res: dict[str, list[str]]) -> int | None:
    """Return the pid of the process that made this lab if it still runs (same pid AND same start time), from its
    record in OWNERS or, for a lab made before records existed, the owner.json in its dir; else None."""
    for path in res.get("owner", []) + [os.path.join(d, "owner.json") for d in res.get("tmp", [])]:
        with contextlib.suppress(OSError, ValueError, KeyError):
            owner = json.load(open(path))
            if _start_time(owner["pid"]) == owner["start"]:
                return owner["pid"]
    return None


def _start_time(pid: int) -> str | None:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def _kill_all(pids: set[int], sig=signal.SIGKILL):
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def ns_pids(ns: str) -> set[int]:
    """Return the pids of the processes living in network namespace `ns`."""
    return {int(p) for p in run("ip", "netns", "pids", ns, check=False).stdout.split()}


def _remove(res: dict[str, list[str]]):
    """Remove one lab's resources: kill what runs in its namespaces, delete namespaces, links, dirs."""
    for ns in res.get("ns", []):
        _kill_all(ns_pids(ns))
    for tmp in res.get("tmp", []):          # sshd of a lab whose namespace is already gone
        _kill_all({int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, tmp)})
    for ns in res.get("ns", []):
        run("ip", "netns", "del", ns, check=False)
    for link in res.get("link", []):
        run("ip", "link", "del", link, check=False)
    for d in res.get("etc", []) + res.get("tmp", []):
        shutil.rmtree(d, ignore_errors=True)
    for record in res.get("owner", []):
        with contextlib.suppress(FileNotFoundError):
            os.remove(record)


def _cmdline_has(pid: str, text: str) -> bool:
    try:
        return text.encode() in open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False


def sweep() -> list[int]:
    """Remove every lab whose owner process is gone (a crashed kernel); return their numbers."""
    stale = [i for i, res in _kit_resources().items() if live_owner(res) is None]
    for i in stale:
        _remove(_kit_resources().get(i, {}))
    return stale


# ------------------------------------------------------------------------------------------------- the lab
class Lab:
    """N emulated hosts h1..hN on one bridge; made by `start()`, removed by `stop()` (or `with`, or atexit)."""

    def __init__(self, lab_id: int, hosts: int, rate: str, dir_: str):
        self.id, self.dir, self.rate = lab_id, dir_, rate
        self._n = names(lab_id, hosts)
        self.hosts = [f"h{i}" for i in range(1, hosts + 1)]
        self.addr = self._n["addr"]
        self.bridge = self._n["bridge"]
        self.ssh_config = os.path.join(dir_, "ssh_config")
        self._sshd: dict[str, subprocess.Popen] = {}
        self._keep: set[int] = set()       # pids kill_jobs() spares besides sshd (kit.netlab.slurm's daemons)
        self._on_stop: list = []           # called first by stop() (kit.netlab.slurm's stop)
        self._stopped = False

    def __repr__(self):
        return f"<Lab {self.id}: {', '.join(self.hosts)} on {self.bridge} {self.addr}/24, {self.rate}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def _index(self, host: str) -> int:
        if host not in self.hosts:
            raise LabError(f"no host {host!r} in this lab: its hosts are {self.hosts}")
        return self.hosts.index(host)

    def ns(self, host: str) -> str:
        """Return the network namespace of `host` (for `ip netns exec NS ...`)."""
        return self._n["ns"][self._index(host)]

    def addr_of(self, host: str) -> str:
        """Return the address of `host` on the lab's bridge."""
        return self._n["host_addr"][self._index(host)]

    def veth(self, host: str) -> str:
        """Return the name of `host`'s link on this machine's side of the bridge."""
        return self._n["veth"][self._index(host)]

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
        """Remove everything this lab made: processes on its hosts, sshd, namespaces, links, keys, dirs."""
        if self._stopped:
            return
        self._stopped = True
        for hook in list(self._on_stop):
            with contextlib.suppress(Exception):   # what it left runs in the lab's namespaces: removed below
                hook()
        self.kill_jobs()                           # sessions and what they started first, so sshd reaps them
        for p in self._sshd.values():
            p.terminate()
        for p in self._sshd.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        _remove(_kit_resources().get(self.id, {}))
        _LABS.discard(self)
        with open(LOCK, "w") as lock:             # the owners' folder goes with the last lab, not while one starts
            fcntl.flock(lock, fcntl.LOCK_EX)
            with contextlib.suppress(OSError):
                os.rmdir(OWNERS)

    def job_pids(self) -> dict[str, set[int]]:
        """Return {host: pids} of what runs on each host but its SSH server and Slurm's daemons: jobs."""
        keep = {p.pid for p in self._sshd.values()} | self._keep
        return {h: ns_pids(self.ns(h)) - keep for h in self.hosts}

    def jobs_left(self, seconds: float = 20) -> dict[str, set[int]]:
        """Wait up to `seconds` for the jobs on the lab's hosts to end (a killed process may take a moment to go);
        return {host: pids} of the hosts where some still run, {} when none does."""
        deadline = time.monotonic() + seconds
        while (left := {h: p for h, p in self.job_pids().items() if p}) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def kill_jobs(self):
        """Kill everything running on the lab's hosts but their SSH servers and Slurm's daemons (a job gone wrong)."""
        for pids in self.job_pids().values():
            _kill_all(pids)

    # ------------------------------------------------------------------------------------------- operations
    def set_rate(self, rate: str):
        """Limit every link to `rate` in each direction (tbf on the egress of both ends of every veth)."""
        bits = parse_rate(rate)
        burst = max(int(bits / 8 * 0.002), 64 * 1024)       # 2 ms of traffic, at least one 64 KB GSO packet
        args = ["root", "tbf", "rate", f"{int(bits)}bit", "burst", str(burst), "latency", "50ms"]
        for host in self.hosts:
            run("tc", "qdisc", "replace", "dev", self.veth(host), *args)
            run("tc", "-n", self.ns(host), "qdisc", "replace", "dev", "eth0", *args)
        self.rate = rate

    def cut(self, host: str):
        """Pull `host`'s cable: its link goes down (packets to and from it are lost until `restore`)."""
        run("ip", "link", "set", self.veth(host), "down")

    def restore(self, host: str):
        """Plug `host`'s cable back in."""
        run("ip", "link", "set", self.veth(host), "up")

    def ssh(self, host: str, cmd: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """Run shell command `cmd` on `host` over SSH with the lab's key and config; return the finished process."""
        self._index(host)
        p = subprocess.run(netlab_ssh.ssh_cmd(self, host, cmd), capture_output=True, text=True, timeout=timeout)
        if check and p.returncode:
            raise LabError(f"ssh {host} {cmd!r} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
        return p

    def launch(self, host: str, argv: list[str], cwd: str | None = None, env: dict | None = None,
               **popen_kw) -> subprocess.Popen:
        """Start `argv` on `host` over SSH in `cwd` (default: here) with `launch_env(**env)` (e.g. horovodrun)."""
        self._index(host)
        line = netlab_ssh.remote_command(self, argv, cwd or os.getcwd(), self.launch_env(**(env or {})))
        return subprocess.Popen(netlab_ssh.ssh_cmd(self, host, line), stdin=subprocess.DEVNULL, **popen_kw)

    def launch_env(self, **extra) -> dict[str, str]:
        """Return what launchers on lab hosts need: the lab's ssh first on PATH, a lab HOME, Open MPI as root."""
        return netlab_ssh.launch_env(self, **extra)

    def horovodrun_args(self, slots: int = 1, hosts: list[str] | None = None) -> list[str]:
        """Return `-np N -H h1:S,h2:S --network-interface eth0` for horovodrun started on a lab host."""
        return netlab_ssh.horovodrun_args(self, slots, hosts)

    def mpi_args(self, slots: int = 1, hosts: list[str] | None = None) -> list[str]:
        """Return mpiexec's `-np -H`, the lab's ssh as Open MPI's agent and the variables to carry to each host."""
        return netlab_ssh.mpi_args(self, slots, hosts)

    def measure_rate(self, a: str, b: str, seconds: float = 3.0) -> dict[str, float]:
        """Stream bytes over a TCP socket a->b, then b->a; return what each receiver got, in bytes/s."""
        return {f"{a}->{b}": netlab_rate.stream(self, a, b, seconds),
                f"{b}->{a}": netlab_rate.stream(self, b, a, seconds)}


_LABS: set[Lab] = set()        # strong references: a lab nobody holds is still stopped at exit


@atexit.register
def _stop_all():
    for lab in list(_LABS):
        lab.stop()


def start(hosts: int = 4, rate: str = "1gbit") -> Lab:
    """Start a lab of `hosts` emulated hosts h1..hN, every link limited to `rate` each way; return the Lab."""
    if not isinstance(hosts, int) or not 1 <= hosts <= 200:
        raise LabError(f"hosts={hosts!r}: give a number of hosts from 1 to 200")
    parse_rate(rate)
    check_requirements()
    with open(LOCK, "w") as lock:                # two labs starting at once must not pick the same number
        fcntl.flock(lock, fcntl.LOCK_EX)
        sweep()
        used = set(_kit_resources())
        free = [i for i in range(MAX_LABS) if i not in used]
        if not free:
            raise LabError(f"{MAX_LABS} labs are running already: stop one (lab.stop())")
        dir_ = tempfile.mkdtemp(prefix=f"{PREFIX}{free[0]}-")
        owner = {"pid": os.getpid(), "start": _start_time(os.getpid()), "dir": dir_}
        with open(os.path.join(dir_, "owner.json"), "w") as f:
            json.dump(owner, f)
        os.makedirs(OWNERS, mode=0o755, exist_ok=True)
        with open(os.path.join(OWNERS, f"{PREFIX}{free[0]}-owner.json"), "w") as f:
            json.dump(owner, f)
        lab = Lab(free[0], hosts, rate, dir_)
        _LABS.add(lab)
    try:
        netlab_ssh.make_keys(lab)
        lab._build()
    except BaseException:
        lab.stop()
        raise
    return lab
