"""Communication on real processes: point-to-point links (link), the parameter server (ps) and its measurements
(ps_measure), a PS sharded over the workers (byteps), ring-allreduce (ring), its pure simulation (ring_sim) and
its timings (allreduce_timing), the cost model (costmodel) and its exercises' checks (exercises), the MNIST-shaped
MLP they train (mlp), and the checks of notebooks 02 and 03 and their appendices (lessons)."""
from kit import _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
