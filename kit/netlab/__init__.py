"""The emulated-host lab: `kit.netlab.start(hosts, rate)` returns a Lab (lab); who owns which lab and the sweep of
dead owners' labs (registry); its SSH servers (ssh), link-rate probe (rate), what a machine needs for it
(requirements) and the system commands under them (system); notebooks 02 and 03's exchange run on a fresh lab or
the committed one (network_run)."""
from kit.netlab.system import LabError, parse_rate, run
from kit.netlab.registry import PREFIX, NAME_RE, MAX_LABS, LOCK, names, ns_pids, sweep
from kit.netlab.lab import Lab, start
from kit.netlab.requirements import check_requirements, why_not
from kit import _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
