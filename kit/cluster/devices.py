"""Which GPU each engine sees (used by ``kit.cluster``): one GPU per local rank, or the CPU, and when to say so;
how many framework threads each engine gets from the cores of its machine."""
from __future__ import annotations

from collections import Counter

from kit.cluster.launchers import ClusterError

from kit.cluster.checks import DEVICES


def plan_devices(gpus: list[str], local_size: int, devices: str = "auto",
                 share_gpus: bool = False) -> tuple[list[str], str]:
    """Return (the GPU ids handed out by local rank, [] = CPU only; a one-line notice or "").

    devices="cpu": no GPU for any engine (CPU work runs with any number of engines on a GPU host).
    devices="gpu": one GPU per local rank; too few GPUs is an error unless share_gpus (engines then share them).
    devices="auto": as "gpu" when there are enough GPUs (or share_gpus), else CPU with a notice.
    """
    if devices not in DEVICES:
        raise ValueError(f"devices must be one of {', '.join(map(repr, DEVICES))}, got {devices!r}")
    gpus = list(gpus)
    enough = len(gpus) >= local_size or (gpus and share_gpus)
    if devices == "cpu" or (devices == "auto" and not gpus):
        return [], ""
    if devices == "gpu" and not gpus:
        raise ClusterError("devices='gpu' but no GPU is visible here: use devices='cpu' (or 'auto') for CPU work")
    if enough:
        return gpus, ""
    if devices == "gpu":
        raise ClusterError(f"{local_size} engines per host but only {len(gpus)} GPU(s) visible: start at most "
                           f"{len(gpus)} engines, or pass share_gpus=True to put several engines on one GPU")
    return [], (f"kit.cluster: {local_size} engines per host but {len(gpus)} GPU(s): the engines run on the CPU "
                "(devices='gpu', share_gpus=True puts several engines on one GPU)")


def threads_per_engine(info: dict) -> int:
    """Return the framework threads per engine: the cores of each machine split between the engines on it, the
    smallest share over the machines. `info`: engine id -> engine_identity() (its "cores" and "machine"). The
    emulated hosts of a kit.netlab lab are one machine: 3 engines on 3 lab hosts of a 2-core box get 1 thread
    each, not 2 (6 threads on 2 cores made a compute step vary from 18 to 425 ms)."""
    on = Counter(i.get("machine", i["host"]) for i in info.values())
    return max(1, min(i["cores"] // on[i.get("machine", i["host"])] for i in info.values()))
