"""Model parallelism by hand (notebook 06): tensor parallelism (tensor), pipeline schedules (pipeline), their
formulas (model), the experiments on engines (experiment) and on the lab (lab)."""
from kit import _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
