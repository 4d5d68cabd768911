"""The SSH side of kit.netlab: one OpenSSH server per emulated host, keys and client config in the lab's temp dir.

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

SSHD_PACKAGE = "openssh-server"


def find_sshd() -> str:
    """Return the path of OpenSSH's server; raise LabError naming the Debian package when it is missing."""
    from .netlab import LabError
    path = shutil.which("sshd") or next((p for p in ("/usr/sbin/sshd", "/sbin/sshd") if os.path.exists(p)), None)
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
            "PermitTunnel": "no", "MaxStartups": "100:30:200", "LogLevel": "ERROR"}
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
    from .netlab import LabError
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


def launch_env(lab, **extra) -> dict:
    """Return the environment for horovodrun/mpiexec driving the lab: the lab's ssh first on PATH, a lab HOME."""
    venv_bin = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=f"{lab.dir}/bin:{venv_bin}:{os.environ.get('PATH', '')}", HOME=f"{lab.dir}/home",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TF_USE_LEGACY_KERAS="1",
               PYTHONUNBUFFERED="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def host_list(lab, slots: dict[str, int] | int, by: str = "addr") -> str:
    """Return "ADDR1:2,ADDR2:2" (or by="name": "h1:2,h2:2") for `slots` per host (a dict, or one number for all)."""
    slots = slots if isinstance(slots, dict) else {h: slots for h in lab.hosts}
    return ",".join(f"{lab.addr_of(h) if by == 'addr' else h}:{k}" for h, k in slots.items())


def remote_env(names=("PATH", "PYTHONPATH", "TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL")) -> list[str]:
    """Return `-x NAME` for the variables mpiexec must carry to the other hosts."""
    return [a for n in names if n in os.environ or n == "PATH" for a in ("-x", n)]


def quote(cmd: list[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)
