"""The SSH side of kit.netlab: one OpenSSH server per emulated host, keys and client config in the lab's folder.

The user's ~/.ssh is never read or written: every ssh the kit (or horovodrun, or mpiexec) starts for the lab
uses `ssh -F LAB/ssh_config`, which names the lab's client key and a known_hosts file holding the lab's host
key. `LAB/bin/ssh` wraps that, so launchers that call plain `ssh` (horovodrun) find it first on PATH.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

from kit.env import FRAMEWORK_ENV
from kit.env import MPI_ENV
from kit.netlab.system import LabError

SSHD_PACKAGE = "openssh-server"
SSHD_PATHS = ("/usr/sbin/sshd", "/sbin/sshd")      # not on a normal user's PATH


def find_sshd() -> str:
    """Return the path of OpenSSH's server; raise LabError naming the Debian package when it is missing."""
    path = shutil.which("sshd") or next((p for p in SSHD_PATHS if os.path.exists(p)), None)
    if not path:
        raise LabError(f"no OpenSSH server (sshd): install Debian's {SSHD_PACKAGE} "
                       f"(apt-get install -y {SSHD_PACKAGE}); `make setup` does this when run as root")
    return path


def make_keys(lab):
    """Write the lab's host key, client key (mode 600), authorized_keys, known_hosts, ssh_config and bin/ssh."""
    d = lab.dir
    for name in ("hostkey", "userkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"kit netlab {lab.id} {name}",
                        "-f", os.path.join(d, name)], check=True, capture_output=True, timeout=30)
    user_pub = open(os.path.join(d, "userkey.pub")).read().strip()
    _write(os.path.join(d, "authorized_keys"), user_pub + "\n")
    host_pub = " ".join(open(os.path.join(d, "hostkey.pub")).read().split()[:2])
    _write(os.path.join(d, "known_hosts"), "".join(
        f"{h},{lab.addr_of(h)} {host_pub}\n" for h in lab.hosts))
    entries = "".join(f"Host {h}\n    HostName {lab.addr_of(h)}\n" for h in lab.hosts)
    _write(lab.ssh_config, entries + f"""Host *
    User root
    IdentityFile {d}/userkey
    IdentitiesOnly yes
    PasswordAuthentication no
    KbdInteractiveAuthentication no
    BatchMode yes
    UserKnownHostsFile {d}/known_hosts
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    ConnectTimeout 10
    LogLevel ERROR
""")
    os.makedirs(os.path.join(d, "bin"), mode=0o700)
    os.makedirs(os.path.join(d, "home"), mode=0o700)
    os.makedirs(os.path.join(d, "tmp"), mode=0o700)         # the hosts' TMPDIR: a killed rank's files go with the lab
    wrapper = os.path.join(d, "bin", "ssh")
    _write(wrapper, f'#!/bin/sh\nexec {shutil.which("ssh")} -F {lab.ssh_config} "$@"\n')
    os.chmod(wrapper, 0o700)


def _write(path: str, text: str):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def sshd_cmd(lab, host: str) -> list[str]:
    """Return sshd's command line for `host`: its own address only, the lab's keys only, no config file."""
    d = lab.dir
    opts = {"ListenAddress": f"{lab.addr_of(host)}:22", "HostKey": f"{d}/hostkey",
            "AuthorizedKeysFile": f"{d}/authorized_keys", "PermitRootLogin": "prohibit-password",
            "AuthenticationMethods": "publickey", "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no", "UsePAM": "no", "StrictModes": "no", "PidFile": "none",
            "X11Forwarding": "no", "AllowAgentForwarding": "no", "AllowTcpForwarding": "no",
            "PermitTunnel": "no", "MaxStartups": "100:30:200", "LogLevel": "ERROR",
            # bash reads ~/.bashrc in an SSH session only as a top-level shell (SHLVL < 2): with SHLVL=1 set, the
            # session's shell is level 2 and skips it. A user's .bashrc (here root's: pyenv init and its rehash
            # lock) is not the lab's business, and a session ended mid-rehash left a lock that made every later
            # login wait 60 s. The kit gives its commands full paths and their environment itself.
            "SetEnv": "SHLVL=1"}
    return [find_sshd(), "-D", "-e", "-f", "/dev/null", *[a for k, v in opts.items() for a in ("-o", f"{k}={v}")]]


def start_sshd(lab, host: str) -> subprocess.Popen:
    """Start `host`'s sshd as a child of this process (so that stop() can wait for it: no zombies)."""
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)      # sshd's privilege-separation directory
    log = open(os.path.join(lab.dir, f"sshd-{host}.log"), "w")
    with log:
        return subprocess.Popen(lab.exec_cmd(host, *sshd_cmd(lab, host)), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)


def ssh_cmd(lab, host: str, cmd: str) -> list[str]:
    """Return the ssh command line that runs shell command `cmd` on `host` with the lab's config."""
    return [shutil.which("ssh"), "-F", lab.ssh_config, host, cmd]


def wait_ready(lab, timeout: float = 30):
    """Wait until every host's sshd answers `hostname` with the host's name; raise LabError naming those that don't."""
    deadline = time.time() + timeout
    pending = list(lab.hosts)
    while pending and time.time() < deadline:
        for host in list(pending):
            if lab._sshd[host].poll() is not None:
                log = open(os.path.join(lab.dir, f"sshd-{host}.log")).read()[-500:]
                raise LabError(f"the SSH server of {host} exited ({lab._sshd[host].returncode}): {log}")
            p = subprocess.run(ssh_cmd(lab, host, "hostname"), capture_output=True, text=True, timeout=30)
            if p.returncode == 0 and p.stdout.strip() == host:
                pending.remove(host)
        time.sleep(0.1 if pending else 0)
    if pending:
        raise LabError(f"the SSH server of {', '.join(pending)} did not answer within {timeout:.0f} s")


LAUNCH_VARS = ("PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "KIT_DATA_DIR")


def launch_env(lab, **extra) -> dict[str, str]:
    """Return the variables a launcher on a lab host needs: the lab's ssh and the venv first on PATH, a lab HOME and
    TMPDIR (an SSH login starts with neither: TensorFlow's autograph files of a killed rank would stay in /tmp)."""
    env = {"PATH": f"{lab.dir}/bin:{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
           "HOME": f"{lab.dir}/home", "TMPDIR": f"{lab.dir}/tmp", **MPI_ENV, **FRAMEWORK_ENV, "PYTHONUNBUFFERED": "1"}
    env.update({k: os.environ[k] for k in LAUNCH_VARS if k in os.environ})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def remote_command(lab, argv: list[str], cwd: str, env: dict[str, str]) -> str:
    """Return the shell line that runs `argv` in `cwd` with exactly `env` added (what ssh sends to the host)."""
    return f"cd {shlex.quote(cwd)} && exec env {shlex.join(f'{k}={v}' for k, v in env.items())} {shlex.join(argv)}"


def host_list(lab, slots: int, hosts: list[str] | None) -> tuple[int, str]:
    """Return (number of slots, "h1:2,h2:2") for `slots` per host on `hosts` (default: all)."""
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 1024:
        raise LabError(f"slots={slots!r}: give the processes per host, an int from 1 to 1024")
    if hosts is not None and (isinstance(hosts, str) or not isinstance(hosts, (list, tuple)) or not hosts):
        raise LabError(f"hosts={hosts!r}: give a non-empty list of the lab's hosts {lab.hosts}, or None for all")
    hosts = hosts or lab.hosts
    for h in hosts:
        lab.addr_of(h)                                      # raises for a host not in the lab
    return slots * len(hosts), ",".join(f"{h}:{slots}" for h in hosts)


def horovodrun_args(lab, slots: int = 1, hosts: list[str] | None = None) -> list[str]:
    """Return horovodrun's -np/-H/--network-interface arguments for `slots` processes on each of `hosts`."""
    np_, hl = host_list(lab, slots, hosts)
    return ["-np", str(np_), "-H", hl, "--network-interface", "eth0"]


def mpi_args(lab, slots: int = 1, hosts: list[str] | None = None) -> list[str]:
    """Return mpiexec's arguments: -np/-H, the lab's ssh as Open MPI's remote agent, eth0, variables to carry."""
    np_, hl = host_list(lab, slots, hosts)
    carry = [a for k in launch_env(lab) if k != "HOME" for a in ("-x", k)]
    return ["-np", str(np_), "-H", hl, "--prefix", sys.prefix, "--mca", "plm_rsh_agent", f"{lab.dir}/bin/ssh",
            "--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0",
            "--mca", "mpi_yield_when_idle", "1",       # the lab's hosts share this machine's cores: no spinning
            "--prtemca", "prte_tmpdir_base", f"{lab.dir}/tmp",  # the daemons' session folders go with the lab
            *carry]
