"""A real Slurm cluster on the lab: slurmctld on h1, one slurmd on every host, one munged for them all.

    with kit.netlab.start(hosts=3) as lab, kit.netlab.slurm.start(lab) as sl:
        sl.nodes()                                         # {'h1': 'idle', 'h2': 'idle', 'h3': 'idle'}
        sl.run(["srun", "-N3", "-n3", "hostname"]).stdout  # 'h1\\nh2\\nh3\\n' (in some order), run from h1
        lab.launch("h1", ["sbatch", "--wrap", "hostname"], env=sl.env)   # any client, with SLURM_CONF from sl.env

Debian's Slurm 22.05 and MUNGE (`apt-get install -y slurmctld slurmd slurm-client munge`), as root. Nothing is
read from or written to /etc/slurm, /etc/munge or /var: slurm.conf, cgroup.conf, a fresh MUNGE key (mode 400), the
MUNGE socket, spool, state, logs and pid files all live in `sl.dir` (LAB/slurm), which `stop()` removes.

Every daemon runs inside a lab host's network namespace with the host's name (UTS namespace) and is a child of this
process (`-D`, `--foreground`, as the lab's sshd), so that `stop()` waits for it and leaves no zombie.
They are started with `nsenter --net=/run/netns/NS`, not `ip netns exec`, which remounts /sys (slurmd then finds no
/sys/fs/cgroup and stops). munged runs in h1's namespace too: it needs no network (a unix socket in `sl.dir`, which
every host reaches, since the hosts share the file system), and there the lab's own clean-up finds it. A lab whose
owner was SIGKILLed is swept by the next `kit.netlab.start()`: it kills every process in the lab's namespaces (all
of Slurm, the jobs' slurmstepd and tasks included) and every process whose command line names the lab's dir (all
the daemons), then removes the dir.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time

from kit.netlab.registry import ns_pids
from kit.netlab.system import LabError

PACKAGES = "slurmctld slurmd slurm-client munge"
TOOLS = ("munged", "slurmctld", "slurmd", "sinfo", "srun", "sbatch", "squeue", "scancel")


def find(tool: str) -> str:
    """Return the path of `tool` (daemons live in /usr/sbin); raise LabError naming the Debian packages if missing."""
    path = shutil.which(tool) or next((p for p in (f"/usr/sbin/{tool}", f"/sbin/{tool}") if os.path.exists(p)), None)
    if not path:
        raise LabError(f"`{tool}` not found: Slurm on the lab needs Debian's {PACKAGES} "
                       f"(apt-get install -y {PACKAGES}); `make setup` does this when run as root")
    return path


def node_line(slurmd: str) -> str:
    """Return this machine's hardware as slurm.conf node parameters (CPUs, sockets, cores, threads), from `slurmd -C`:
    a node whose CPUs do not match what slurmd finds is refused."""
    out = subprocess.run([slurmd, "-C"], capture_output=True, text=True, timeout=30).stdout.split()
    keep = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
    params = [w for w in out if w.split("=", 1)[0] in keep]
    return " ".join(params) or f"CPUs={os.cpu_count()}"


def write_config(sl, partition: str, slurmd_timeout: int):
    """Write slurm.conf and cgroup.conf into `sl.dir`: every path under it, h1 the controller, every host a node."""
    d, lab = sl.dir, sl.lab
    hardware = node_line(find("slurmd"))
    nodes = "".join(f"NodeName={h} NodeAddr={lab.addr_of(h)} {hardware} State=UNKNOWN\n" for h in lab.hosts)
    conf = f"""# kit.netlab.slurm: lab {lab.id} ({', '.join(lab.hosts)}); removed with the lab
ClusterName=kitlab{lab.id}
SlurmctldHost=h1({lab.addr_of('h1')})
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
EnforcePartLimits=ALL
SlurmdTimeout={slurmd_timeout}
InactiveLimit=0
KillWait=5
MessageTimeout=5
MinJobAge=10
{nodes}PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    for name, text in (("slurm.conf", conf), ("cgroup.conf", "CgroupPlugin=autodetect\nCgroupAutomount=no\n")):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    os.makedirs(os.path.join(d, "state"), mode=0o700)
    for h in lab.hosts:
        os.makedirs(os.path.join(d, f"spool-{h}"), mode=0o700)
    fd = os.open(os.path.join(d, "munge.key"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1024))


class Slurm:
    """Slurm on a lab's hosts; made by `start()`, removed by `stop()`, `with`, or the lab's own stop."""

    def __init__(self, lab, partition: str):
        self.lab, self.partition = lab, partition
        self.dir = os.path.join(lab.dir, "slurm")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.env = {"SLURM_CONF": self.conf}
        self.daemons: dict[str, subprocess.Popen] = {}     # "munged", "slurmctld", "slurmd-h1", ...
        self._stopped = False

    def __repr__(self):
        return f"<Slurm on lab {self.lab.id}: partition {self.partition!r}, {', '.join(self.lab.hosts)}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def host_cmd(self, host: str, *cmd: str) -> list[str]:
        """Return the command line that runs `cmd` in `host`'s network namespace with its hostname and the lab's
        /etc/hosts (`ip netns exec` bind-mounts /etc/netns/NS/hosts; nsenter does not, and Horovod's Gloo
        segfaulted in hvd.init() where the host's own name did not resolve). The bind mount lives in a private
        mount namespace of its own (unshare --mount), so this machine's /etc/hosts is untouched."""
        ns = self.lab.ns(host)
        return ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", "sh", "-c",
                f'mount --bind /etc/netns/{ns}/hosts /etc/hosts && hostname {host} && exec "$@"', "sh", *cmd]

    def _daemon(self, name: str, host: str, *cmd: str):
        with open(os.path.join(self.dir, f"{name}.out"), "w") as out:
            self.daemons[name] = subprocess.Popen(self.host_cmd(host, *cmd), stdin=subprocess.DEVNULL, stdout=out,
                                                  stderr=subprocess.STDOUT, start_new_session=True)
        self.lab.keep([self.daemons[name].pid])        # lab.kill_jobs() spares it, as it spares sshd

    def _start(self, slurmd_timeout: int, timeout: float):
        os.makedirs(self.dir, mode=0o700)
        write_config(self, self.partition, slurmd_timeout)
        d = self.dir
        self._daemon("munged", "h1", find("munged"), "--foreground", "--force", f"--socket={d}/munge.sock",
                     f"--key-file={d}/munge.key", f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                     f"--seed-file={d}/munge.seed")
        self._wait(lambda: os.path.exists(f"{d}/munge.sock"), timeout, "munged made no socket")
        self._daemon("slurmctld", "h1", find("slurmctld"), "-D", "-f", self.conf)
        for h in self.lab.hosts:
            self._daemon(f"slurmd-{h}", h, find("slurmd"), "-D", "-f", self.conf, "-N", h)
        self._wait(lambda: set(self.nodes().values()) == {"idle"} and len(self.nodes()) == len(self.lab.hosts),
                   timeout, "not every node became idle")
        ctld = self.daemons["slurmctld"].pid
        self.lab.keep([p for p in ns_pids(self.lab.ns("h1")) if _ppid(p) == ctld])      # its slurmscriptd

    def _wait(self, ready, timeout: float, what: str):
        """Poll `ready()` until true; raise LabError with the daemons' log tails when one exits or time is up."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            dead = {n: p.returncode for n, p in self.daemons.items() if p.poll() is not None}
            if dead:
                raise LabError(f"Slurm on lab {self.lab.id}: {dead} exited while starting\n{self.log_tails()}")
            if ready():
                return
            time.sleep(0.2)
        raise LabError(f"Slurm on lab {self.lab.id}: {what} within {timeout:.0f} s\n{self.log_tails()}")

    def log_tails(self, lines: int = 8) -> str:
        """Return the last `lines` of every daemon's log (its output where it keeps no log file: munged)."""
        out = []
        for name in self.daemons:
            paths = [os.path.join(self.dir, name + ext) for ext in (".log", ".out")]
            path = next((p for p in paths if os.path.exists(p) and os.path.getsize(p)), None)
            if path:
                text = open(path, errors="replace").read().splitlines()[-lines:]
                out.append(f"--- {os.path.basename(path)}\n" + "\n".join(text))
        return "\n".join(out)

    # -------------------------------------------------------------------------------------------- clients
    def client_env(self, **extra) -> dict[str, str]:
        """Return the environment of a client run by `run()`: this process's (without its SLURM_* variables), the
        lab's launch environment (venv first on PATH, lab HOME and TMPDIR, Open MPI as root) and `sl.env`."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
        return {**base, **self.lab.launch_env(**self.env), **{k: str(v) for k, v in extra.items()}}

    def run(self, argv: list[str], host: str = "h1", timeout: float = 60, check: bool = False,
            env: dict | None = None, **kw) -> subprocess.CompletedProcess:
        """Run a client (sinfo, srun, sbatch, salloc, squeue, scontrol...) on `host` (default the login node h1);
        return the finished process (text, stdout and stderr captured unless `kw` says otherwise)."""
        kw = {"capture_output": "stdout" not in kw and "stderr" not in kw, "text": True, **kw}
        p = subprocess.run(self.host_cmd(host, *argv), env=self.client_env(**(env or {})), timeout=timeout, **kw)
        if check and p.returncode:
            raise LabError(f"{' '.join(argv)} failed ({p.returncode}): {(p.stderr or '').strip()[-500:]}")
        return p

    def nodes(self) -> dict[str, str]:
        """Return {node: state} as `sinfo` reports it ('idle', 'alloc', 'down*', ...); {} if slurmctld is not up."""
        p = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30)
        return dict(line.split() for line in p.stdout.splitlines() if len(line.split()) == 2) if not p.returncode \
            else {}

    def jobs(self) -> list[str]:
        """Return the ids of the jobs Slurm still holds (pending, running or completing)."""
        p = self.run(["squeue", "-h", "-o", "%i"], timeout=30)
        return p.stdout.split() if not p.returncode else []

    # ------------------------------------------------------------------------------------------------ stop
    def stop(self):
        """Cancel every job, stop the daemons (SIGTERM, then SIGKILL after 10 s; reaped), remove `sl.dir`."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.daemons.get("slurmctld") and self.daemons["slurmctld"].poll() is None:
                if jobs := self.jobs():
                    self.run(["scancel", "--full", *jobs], timeout=30)
                    deadline = time.time() + 10
                    while self.jobs() and time.time() < deadline:
                        time.sleep(0.2)
        except (subprocess.TimeoutExpired, OSError):
            pass
        order = [n for n in self.daemons if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for group in (order[:-2], order[-2:-1], order[-1:]):       # slurmds, then the controller, then munged
            procs = [self.daemons[n] for n in group if n in self.daemons]
            for p in procs:
                _signal(p, signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)      # the daemon and whatever it forked
                    except ProcessLookupError:
                        pass
                    p.wait(timeout=10)
        self._kill_steps()            # the lab spares a kept pid only while its process lives (its start time)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _kill_steps(self):
        """Kill what is left of the jobs on the lab's hosts: every slurmstepd and what runs below it."""
        pids = {p: _ppid(p) for h in self.lab.hosts for p in ns_pids(self.lab.ns(h))}
        doomed = {p for p in pids if _cmdline(p).startswith(b"slurmstepd")}
        while more := {p for p, parent in pids.items() if parent in doomed} - doomed:
            doomed |= more
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _cmdline(pid: int) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""


def _ppid(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _signal(p: subprocess.Popen, sig: int):
    if p.poll() is None:
        try:
            p.send_signal(sig)
        except ProcessLookupError:
            pass


def start(lab, partition: str = "lab", slurmd_timeout: int = 10, timeout: float = 60) -> Slurm:
    """Start Slurm on `lab` (controller on h1, a node per host, partition `partition` holding them all) and wait
    until every node is idle; return the Slurm. `slurmd_timeout`: seconds before a silent node is marked down."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", partition):
        raise LabError(f"partition {partition!r}: use letters, digits and _ only")
    for tool in TOOLS + ("nsenter",):
        find(tool)
    if os.path.exists(os.path.join(lab.dir, "slurm")):
        raise LabError(f"lab {lab.id} runs Slurm already: stop it first (sl.stop())")
    sl = Slurm(lab, partition)
    lab.on_stop(sl.stop)                          # lab.stop() (with, atexit) stops Slurm first
    try:
        sl._start(slurmd_timeout, timeout)
    except BaseException:
        sl.stop()
        raise
    return sl
