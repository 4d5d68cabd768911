"""Engines as one job: `kit.cluster.start(n, backend=...)` returns a Cluster (core); how engines start
(launchers, remote), what runs on them (engines), which device each gets (devices), stalled collectives (stall)."""
from kit.cluster.core import BACKENDS, DEFAULT_TIMEOUT, Cluster, RankDiedError, StallError, engine_env, start
from kit.cluster.devices import DEVICES, plan_devices
from kit.cluster.launchers import LAUNCHERS, LOCALHOST, ClusterError, Slot, assign_slots, gloo_env, launcher
from kit.cluster.remote import parse_hosts
from kit import _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
