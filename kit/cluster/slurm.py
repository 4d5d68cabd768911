"""Engines as ONE Slurm job (used by ``kit.cluster`` when it is given ``slurm=``): sbatch + srun, as ipyparallel's
``SlurmEngineSetLauncher`` and CSCS's ipcmagic (``%ipcluster start -n N --launcher srun``) do.

    with kit.netlab.start(hosts=3) as lab, kit.netlab.slurm.start(lab) as sl:
        cluster = kit.cluster.start(n=3, backend="gloo", slurm=sl)    # Slurm on the lab: n / 3 engines per node
        cluster.launcher.job()        # {'JobId': '4', 'JobState': 'RUNNING', 'NodeList': 'h[1-3]', ...}
        cluster.stop()                # scancel; returns once squeue no longer shows the job

    # a real cluster: this machine is a login node (sbatch on PATH) that the nodes reach at ip=
    kit.cluster.start(n=8, backend="mpi", ip="10.1.2.3",
                      slurm=dict(partition="gpu", account="proj42", time="00:30:00", nodes=2, sbatch=["--gres=gpu:4"]))

gloo: the batch script runs `srun python -m ipyparallel.engine`, one task per engine; ranks are Slurm's
      (SLURM_PROCID), Horovod's rendezvous server listens on `ip` in the notebook's process, and each engine's
      Gloo interface is the one its route to `ip` leaves by.
mpi:  the batch script runs `mpiexec python -m ipyparallel.engine`; Open MPI reads the allocation from Slurm and
      starts its daemons on the other nodes with srun (PyPI's Open MPI 5 is built with Slurm support). Ranks are
      MPI's, which follow Slurm's node order.
A job Slurm refuses (a bad partition or account, more nodes than exist) is a ClusterError with sbatch's own
message; one still pending after `queue_timeout` s is cancelled and named with Slurm's reason (e.g. Resources).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field

from kit.cluster import remote
from kit.cluster.launchers import LOCALHOST, MPI_ENV, ClusterError, GlooLauncher, MPILauncher, find_mpiexec, gloo_env

OPTIONS = ("partition", "account", "time", "nodes", "sbatch", "queue_timeout", "cluster")
GONE = {"", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
        "DEADLINE"}


@dataclass
class Job:
    """The engines' Slurm job: where it may run and how Slurm's clients are called."""
    n: int
    nodes: int | None = None
    partition: str = ""
    account: str = ""
    time: str = ""
    sbatch: list[str] = field(default_factory=list)   # extra #SBATCH options, e.g. ["--gres=gpu:4"]
    queue_timeout: float | None = None                # s a job may stay pending (default: the cluster's timeout)
    prefix: list[str] = field(default_factory=list)   # runs Slurm's clients (the lab: in h1, with its SLURM_CONF)
    env: dict[str, str] = field(default_factory=dict)  # the engines' extra environment (exported by sbatch)

    def client(self, *argv: str) -> list[str]:
        return [*self.prefix, *argv]

    def query(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(self.client(*argv), capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} gave no answer within {timeout:.0f} s")
        except OSError as e:                              # not installed here
            return subprocess.CompletedProcess(argv, 127, "", str(e))

    def per_node(self) -> int | None:
        return self.n // self.nodes if self.nodes else None

    def header(self) -> str:
        """Return the batch script's #SBATCH lines (braces doubled: ipyparallel formats the script)."""
        lines = ["--export=ALL", "--no-requeue", f"--ntasks={self.n}"]    # requeued engines would find no controller
        if self.nodes:
            lines += [f"--nodes={self.nodes}", f"--ntasks-per-node={self.per_node()}"]
        lines += [f"--{k}={v}" for k, v in (("partition", self.partition), ("account", self.account),
                                            ("time", self.time)) if v]
        lines += list(self.sbatch)
        return "".join(f"#SBATCH {line}\n" for line in lines).replace("{", "{{").replace("}", "}}")


def job_for(slurm, n: int, ip: str) -> tuple[Job, str]:
    """Return (the Job, the address servers bind) for `slurm=`: a kit.netlab.slurm.Slurm (Slurm on a lab), a dict
    of options (a real cluster; its key "cluster" may hold a lab's Slurm), or True (a real cluster, defaults)."""
    opts = {} if slurm is True else dict(slurm) if isinstance(slurm, dict) else {"cluster": slurm}
    unknown = set(opts) - set(OPTIONS)
    if unknown:
        raise ValueError(f"slurm= options {sorted(unknown)} unknown: use {', '.join(OPTIONS)}")
    sl = opts.pop("cluster", None)
    job = Job(n=n, **{k: v for k, v in opts.items()})
    job.sbatch = [job.sbatch] if isinstance(job.sbatch, str) else list(job.sbatch)
    if sl is not None:      # Slurm on a kit.netlab lab: clients run on h1 (the login node), servers on lab.addr
        lab = sl.lab
        job.nodes = job.nodes or len(lab.hosts)
        job.partition = job.partition or sl.partition
        job.prefix = sl.host_cmd("h1", "env", f"SLURM_CONF={sl.conf}")
        job.env = {k: v for k, v in remote.Remote(env=lab.launch_env()).env.items() if k != "PATH"}
        ip = lab.addr
    elif ip == LOCALHOST:
        raise ValueError("engines in a Slurm job need ip= an address of this machine that the nodes reach "
                         "(servers then listen there instead of 127.0.0.1)")
    else:
        job.env = remote.Remote().env
    if job.nodes is not None and (not isinstance(job.nodes, int) or job.nodes < 1 or n % job.nodes):
        raise ValueError(f"n={n} engines do not split evenly over nodes={job.nodes}: use n = a multiple of nodes")
    return job, ip


def launcher_for(backend: str, slurm, n: int, ip: str, mpiexec: str | None):
    """Return (hosts, the address servers bind, the launcher) for engines in one Slurm job."""
    job, ip = job_for(slurm, n, ip)
    return f"slurm:{job.nodes or '?'}", ip, SLURM_LAUNCHERS[backend](job=job, ip=ip, mpiexec=mpiexec)


def parse_fields(text: str) -> dict[str, str]:
    """Parse `scontrol show job -o` (Key=Value ...) into a dict."""
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))


class _SlurmMixin:
    """What both Slurm launchers share: the engine set, the job, waiting in the queue, lost nodes, clean-up."""
    job: Job
    ipp_cluster = None                 # the ipyparallel cluster whose engine set (one batch job) this starts
    _next_probe = 0.0
    _job_id = ""

    def __init__(self, *, job: Job, **kwargs):
        super().__init__(**kwargs)
        self.job = job

    def check(self):
        super().check()
        p = self.job.query("sinfo", "--version")
        if p.returncode:
            raise ClusterError(f"cannot run Slurm's clients ({shlex.join(self.job.client('sinfo'))}: "
                               f"{(p.stderr or p.stdout).strip()[-300:]}): is this a Slurm login node? Nothing "
                               "was started.")

    def configure_engines(self, ipp_cluster, command: str):
        """Make ipyparallel submit one batch job whose script runs `command` (+ the engine's own arguments)."""
        cls = slurm_engine_set_launcher()
        ipp_cluster.engine_launcher_class = cls
        cfg = ipp_cluster.config[cls.__name__]
        for name, argv in (("submit_command", ["sbatch", "--parsable"]), ("delete_command", ["scancel"]),
                           ("signal_command", ["scancel", "-s"])):
            cfg[name] = self.job.client(*argv)
        cfg.batch_template = ("#!/bin/sh\n#SBATCH --job-name=kit-engines-{cluster_id}\n#SBATCH --output={output_file}\n"
                              + self.job.header() + command.replace("{", "{{").replace("}", "}}") +
                              " {program_and_args}\n")
        cfg.environment = {**self.job.env, "KIT_ROUTE_TO": self.ip}
        cfg.engine_cmd = [sys.executable, "-m", "ipyparallel.engine"]
        cfg.batch_file_name = os.path.join(ipp_cluster.profile_dir, "engines.sbatch")   # not in the cwd
        self.ipp_cluster = ipp_cluster

    @property
    def job_id(self) -> str:
        """The engines' Slurm job id ('' before sbatch answered and after stop)."""
        sets = list(getattr(self.ipp_cluster, "engines", {}).values())
        if sets and getattr(sets[0], "job_id", ""):      # ipyparallel forgets its engine set once it stopped it
            self._job_id = sets[0].job_id
        return self._job_id

    def job_info(self) -> dict[str, str]:
        """Return the job as `scontrol show job` has it (JobId, JobState, Reason, NodeList, ...); {} once gone."""
        if not self.job_id:
            return {}
        p = self.job.query("scontrol", "show", "job", "-o", self.job_id)
        return parse_fields(p.stdout) if not p.returncode else {}

    def wait_for_engines(self, client, n: int, timeout: float):
        """Wait until the job runs and all n engines registered; a job still pending after the queue timeout, or
        one that ended, is cancelled and is a ClusterError with Slurm's state and reason."""
        queue_timeout = self.job.queue_timeout if self.job.queue_timeout is not None else timeout
        t0, started = time.monotonic(), None
        while len(client.ids) < n:
            info = self.job_info()
            state = info.get("JobState", "")
            if state == "RUNNING" and started is None:
                started = time.monotonic()
            if state in GONE or (started is None and time.monotonic() - t0 > queue_timeout) or \
                    (started is not None and time.monotonic() - started > timeout):
                job_id = self.job_id
                self.stop()
                why = (f"is {state} (reason: {info.get('Reason', '?')})" if state else "is gone") \
                    if state != "RUNNING" else f"runs but only {len(client.ids)} of {n} engines registered"
                raise ClusterError(f"Slurm job {job_id or '?'} {why} after {time.monotonic() - t0:.0f} s; it was "
                                   f"cancelled, nothing is left queued. Free nodes, another partition "
                                   f"(slurm=dict(partition=...)) or a longer queue_timeout may help.")
            try:
                client.wait_for_engines(n, timeout=2, interactive=False)
            except TimeoutError:
                pass

    def lost_now(self, slots, after: float, every: float = 3.0) -> dict[int, str]:
        """Every `every` s: ranks on nodes Slurm calls down or not responding, or all of them if the job ended.
        `after` is not waited again: Slurm marks a node so only once it missed slurmctld's own timeout."""
        now = time.monotonic()
        if now < self._next_probe:
            return {}
        self._next_probe = now + every
        return self.lost_ranks(slots)

    def lost_ranks(self, slots) -> dict[int, str]:
        info = self.job_info()
        if info.get("JobState", "RUNNING") in GONE:
            return {s.rank: f"Slurm job {self.job_id} is {info['JobState']} (reason: {info.get('Reason', '?')})"
                    for s in slots.values()}
        hosts = sorted({s.hostname for s in slots.values()})
        p = self.job.query("sinfo", "-h", "-N", "-o", "%N %T", "-n", ",".join(hosts))
        bad = {h: st for h, st in (line.split() for line in p.stdout.splitlines() if len(line.split()) == 2)
               if st.endswith("*") or st.rstrip("*~#!%$@^-").upper() in ("DOWN", "DRAIN", "DRAINED", "FAIL")}
        return {s.rank: f"node {s.hostname} is {bad[s.hostname]} in Slurm, job {self.job_id}: it stopped answering "
                        "slurmctld"
                for s in slots.values() if s.hostname in bad}

    def stop(self):
        """Cancel the job (ipyparallel's scancel may have gone first) and wait until squeue no longer shows it:
        30 s, then SIGKILL to every step and 30 s more."""
        super().stop()
        if self.job_id:
            for argv in (["scancel"], ["scancel", "-s", "KILL", "--full"]):
                self.job.query(*argv, self.job_id)
                deadline = time.monotonic() + 30
                while self.job.query("squeue", "-h", "-j", self.job_id, "-o", "%T").stdout.strip() and \
                        time.monotonic() < deadline:
                    time.sleep(0.5)
                if time.monotonic() < deadline:
                    break
            else:
                warnings.warn(f"Slurm job {self.job_id} is still listed by squeue 60 s after scancel", stacklevel=2)
        self.ipp_cluster, self._job_id = None, ""


class SlurmGlooLauncher(_SlurmMixin, GlooLauncher):
    """`srun` one engine per task, joined by Horovod's rendezvous server on `ip`."""

    def configure(self, ipp_cluster):
        self.configure_engines(ipp_cluster, "srun --kill-on-bad-exit=0")

    def rank_order(self, info):
        return sorted(info, key=lambda e: info[e]["slurm"]["rank"])

    def check_slots(self, slots, info):
        super().check_slots(slots, info)
        self._iface = {info[e]["host"]: info[e].get("route_iface", "") for e in info}
        wrong = {e: (slots[e].rank, info[e]["slurm"]) for e in slots if
                 (slots[e].rank, slots[e].local_rank) != (info[e]["slurm"]["rank"], info[e]["slurm"]["local_rank"])}
        if wrong:
            raise ClusterError(f"Slurm placed tasks in an unexpected order (engine: (rank, Slurm's)): {wrong}")

    def job_env(self, slots):
        env = super().job_env(slots)
        for e, s in slots.items():
            if not self._iface.get(s.hostname):
                raise ClusterError(f"cannot tell which interface {s.hostname} uses to reach {self.ip}")
            env[e].update(gloo_env(s, addr=self.ip, port=self.rendezvous.port, iface=self._iface[s.hostname]))
        return env


class SlurmMPILauncher(_SlurmMixin, MPILauncher):
    """`mpiexec` inside the allocation: Open MPI starts its daemons with srun and maps ranks by node."""

    def configure(self, ipp_cluster):
        subnet = remote.local_subnet(self.ip)
        per_node = self.job.per_node()
        args = [find_mpiexec(self.mpiexec), "--oversubscribe", "--prefix", sys.prefix, "-n", str(self.job.n),
                *(["--map-by", f"ppr:{per_node}:node"] if per_node else []),
                "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet]
        self.job.env = {**MPI_ENV, **self.job.env}
        self.configure_engines(ipp_cluster, shlex.join(args))


SLURM_LAUNCHERS = {"gloo": SlurmGlooLauncher, "mpi": SlurmMPILauncher}


def slurm_engine_set_launcher():
    """Return ipyparallel's Slurm engine-set launcher, telling its kit launcher the job id and sbatch's errors."""
    global _SLURM_ENGINES
    if _SLURM_ENGINES is None:
        from ipyparallel.cluster.launcher import SlurmEngineSetLauncher

        class KitSlurmEngineSetLauncher(SlurmEngineSetLauncher):
            """sbatch's own error message in the exception when it refuses the job."""
            def _run_command(self, command, **kwargs):
                p = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                   timeout=60, **kwargs)
                if p.returncode and command[-1] == self.batch_file:
                    said = " / ".join(line.strip() for line in p.stderr.strip().splitlines()[-3:])
                    raise ClusterError(f"Slurm refused the engines' job: {said}. Nothing was queued.")
                return p.stdout

            def get_output(self, remove=True):
                return super().get_output(remove=False)     # the job's output stays in the cluster's folder

        _SLURM_ENGINES = KitSlurmEngineSetLauncher
    return _SLURM_ENGINES


_SLURM_ENGINES = None
