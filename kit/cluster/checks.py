"""`kit.cluster.start`'s arguments, checked at the door (before anything starts), and the `Hosts` protocol.

Every check raises ArgumentError naming the argument, the value given and what is allowed. The cluster's
`timeout` is a float of seconds; Horovod's Gloo timeout, its stall inspector and KIT_TIMEOUT take whole seconds:
they get `whole_seconds(timeout)`, the timeout rounded UP (timeout=0.5 gives 1 s there, never 0).
"""
from __future__ import annotations

import ipaddress
import math
import os
import socket
from typing import Mapping, Protocol, Sequence, runtime_checkable

DEVICES = ("auto", "cpu", "gpu")   # where an engine computes (kit.cluster.devices.plan_devices)


class ArgumentError(ValueError, TypeError):
    """A bad argument: the message names it, the value given and what is allowed. Nothing was started."""


@runtime_checkable
class Hosts(Protocol):
    """Where `hosts=` engines run, as kit.cluster.remote reads it: a kit.netlab lab satisfies it.

    hosts: the host names (engines are split evenly over them); ssh_config: the ssh configuration file that reaches
    them (`ssh -F`); dir: a folder whose bin/ssh is that ssh as one program (Open MPI's plm_rsh_agent); addr: this
    machine's address the hosts reach (servers listen there); launch_env(): variables every remote process gets."""
    hosts: Sequence[str]
    ssh_config: str
    dir: str
    addr: str

    def launch_env(self) -> Mapping[str, str]: ...


def _bad(name: str, value, allowed: str, call: str = "kit.cluster.start") -> ArgumentError:
    done = ". Nothing was started." if call == "kit.cluster.start" else "."
    return ArgumentError(f"{call}: {name}={value!r} is not allowed: {allowed}{done}")


def whole_number(name: str, value, low: int = 1, allowed: str = "") -> int:
    """Return `value` if it is an int >= low (a bool is not), else raise ArgumentError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _bad(name, value, allowed or f"a whole number >= {low}")
    return value


def seconds(name: str, value) -> float:
    """Return `value` as float seconds if it is a finite number > 0 (not a bool, not a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _bad(name, value, "a finite number of seconds > 0, e.g. timeout=60 (whole-second settings such as "
                                "Horovod's Gloo timeout get it rounded up: 0.5 gives 1 s)")
    return float(value)


def whole_seconds(timeout: float) -> int:
    """Return `timeout` rounded up to whole seconds, at least 1 (for settings that take whole seconds)."""
    return max(1, math.ceil(timeout))


def check_hosts(hosts, n: int) -> str | Hosts | None:
    """Return `hosts` as "h1:k,h2:k" (a list of names: n split evenly), a Hosts (a lab), or None."""
    if hosts is None or isinstance(hosts, Hosts):
        return hosts
    allowed = ("horovodrun's 'server1:4,server2:4', a list of host names (n split evenly over them), or a "
               "kit.netlab lab (anything with hosts, ssh_config, dir, addr and launch_env())")
    if isinstance(hosts, str):
        if not hosts.strip():
            raise _bad("hosts", hosts, allowed)
        return hosts
    if not isinstance(hosts, (list, tuple)) or not hosts or not all(isinstance(h, str) and h.strip() for h in hosts):
        raise _bad("hosts", hosts, allowed)
    if all(":" in h for h in hosts):
        return ",".join(hosts)
    if n % len(hosts):
        raise _bad("hosts", hosts, f"n={n} engines must split evenly over the {len(hosts)} host(s) of a list "
                                   "(or write the slots, e.g. 'server1:3,server2:2')")
    return ",".join(f"{h}:{n // len(hosts)}" for h in hosts)


IP_ALLOWED = "an address of this machine, e.g. '127.0.0.1' (the default) or lab.addr"
WILDCARDS = ("0.0.0.0", "::")   # every interface: refused unless allow_all_interfaces=True


def check_ip(ip, allow_all_interfaces: bool = False) -> str:
    """Return `ip` if it is an IPv4 or IPv6 address (a string), and not the wildcard unless allowed."""
    try:
        ip = str(ipaddress.ip_address(ip))
    except ValueError:
        raise _bad("ip", ip, IP_ALLOWED) from None
    if ip in WILDCARDS and not allow_all_interfaces:
        raise _bad("ip", ip, f"{IP_ALLOWED}; {ip} listens on every interface and Horovod's Gloo rendezvous has no "
                             "authentication (allow_all_interfaces=True to allow it anyway)")
    return ip


def interface_addresses() -> set[str]:
    """Return every address of this machine's network interfaces (IPv4 and IPv6, without an IPv6 scope)."""
    import psutil
    return {str(ipaddress.ip_address(a.address.split("%")[0])) for addrs in psutil.net_if_addrs().values()
            for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)}


def check_local_ip(ip: str):
    """Raise ArgumentError unless `ip` (checked by check_ip) is an address of this machine's interfaces (or a
    wildcard allowed there)."""
    if ip not in WILDCARDS and ip not in interface_addresses():
        raise _bad("ip", ip, f"{IP_ALLOWED} (servers listen on it); {ip} is on none of its interfaces")


# What a machine holds: more engines than this (or than the memory holds) only with oversubscribe=True.
ENGINES_PER_CORE = 4
ENGINE_MEMORY = 512 << 20       # bytes per engine: measured 0.17 GiB private (torch, Horovod), 0.34 with TensorFlow


def capacity(cores: int, available: int) -> tuple[int, int]:
    """Return (engines the cores hold, engines the available memory holds, in bytes)."""
    return ENGINES_PER_CORE * cores, available // ENGINE_MEMORY


def check_capacity(n: int, cores: int | None = None, available: int | None = None):
    """Raise ArgumentError if n engines are more than this machine holds (its cores and available memory)."""
    import psutil
    from kit.env import cpu_cores
    cores = cpu_cores() if cores is None else cores
    available = psutil.virtual_memory().available if available is None else available
    by_cores, by_memory = capacity(cores, available)
    if n > min(by_cores, by_memory):
        raise _bad("n", n, f"at most {max(1, min(by_cores, by_memory))} engines here ({cores} cores x "
                           f"{ENGINES_PER_CORE} = {by_cores}; {available / 2**30:.1f} GiB available / "
                           f"{ENGINE_MEMORY / 2**30:.1f} GiB per engine = {by_memory}); oversubscribe=True starts "
                           "more anyway (docs/cluster.md: what it costs)")


def check_start(*, n, backend, timeout, devices, share_gpus, threads, mpiexec, hosts, slurm, ip, quiet,
                oversubscribe=False, allow_all_interfaces=False, backends) -> dict:
    """Check every argument of kit.cluster.start; return them normalised (hosts as above, timeout a float)."""
    whole_number("n", n, 1, "a whole number of engines >= 1, e.g. kit.cluster.start(n=2)")
    if not isinstance(backend, str) or backend not in backends:
        raise _bad("backend", backend, f"one of {', '.join(map(repr, backends))} ('gloo' needs no MPI)")
    timeout = seconds("timeout", timeout)
    if not isinstance(devices, str) or devices not in DEVICES:
        raise _bad("devices", devices, f"one of {', '.join(map(repr, DEVICES))}")
    for name, flag in (("share_gpus", share_gpus), ("quiet", quiet), ("oversubscribe", oversubscribe),
                       ("allow_all_interfaces", allow_all_interfaces)):
        if not isinstance(flag, bool):
            raise _bad(name, flag, "True or False")
    if threads is not None:
        whole_number("threads", threads, 1, "a whole number of threads per engine >= 1, or None (cores split "
                                            "between the engines of each machine)")
    if mpiexec is not None and not isinstance(mpiexec, (str, os.PathLike)):
        raise _bad("mpiexec", mpiexec, "the path of an mpiexec, or None (the venv's, else PATH's)")
    if hosts is not None and slurm is not None:
        raise ArgumentError("give hosts= (SSH) or slurm= (a Slurm job), not both: Slurm chooses the hosts")
    hosts = check_hosts(hosts, n)
    ip = check_ip(ip, allow_all_interfaces)
    if not oversubscribe and slurm is None and (hosts is None or isinstance(hosts, Hosts)):  # on this machine
        check_capacity(n)
    if slurm is not None and slurm is not True and isinstance(slurm, (bool, str, int, float, list, tuple)):
        raise _bad("slurm", slurm, "a kit.netlab.slurm cluster, a dict of options (partition=, account=, time=, "
                                   "nodes=, sbatch=[...]), or True")
    return dict(n=n, backend=backend, timeout=timeout, devices=devices, share_gpus=share_gpus, threads=threads,
                mpiexec=None if mpiexec is None else os.fspath(mpiexec), hosts=hosts, slurm=slurm,
                ip=ip, quiet=quiet)
