"""Engines as one job: `kit.cluster.start(n=..., backend=...)` returns a Cluster (core); its arguments are checked
at the door (checks); how engines start (launchers, remote, slurm), what runs on them (engines), which device each
gets (devices), stalled collectives (stall), a stopped or broken cluster's refusals (guard), the live ones (live)."""
from kit.cluster.checks import ArgumentError, Hosts
from kit.cluster.core import BACKENDS, DEFAULT_TIMEOUT, Cluster, engine_env, start
from kit.cluster.devices import DEVICES, plan_devices
from kit.cluster.guard import ClusterStoppedError, ControllerDiedError, NoAnswerError, RankDiedError, StallError
from kit.cluster.launchers import LAUNCHERS, LOCALHOST, ClusterError, Slot, assign_slots, gloo_env, launcher
from kit.cluster.remote import parse_hosts
from kit import _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
