"""The emulated-host lab: `kit.netlab.start(hosts, rate)` returns a Lab (lab); its SSH servers (ssh), link-rate
probe (rate), what a machine needs for it (requirements) and the system commands under them (system)."""
from kit.netlab.lab import (
    LabError, parse_rate, run, PREFIX, NAME_RE, MAX_LABS, LOCK, names, ns_pids, sweep, Lab, start)
from kit.netlab.requirements import check_requirements, why_not
from kit import _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
