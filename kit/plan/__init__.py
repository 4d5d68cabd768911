"""Plan before you run: one step-time and memory planner on typed descriptions (issue 64).

    from kit.plan import Model, Link, Cluster, Strategy, predict, plan, table
    rows = plan(model, cluster, global_batch)     # one row of numbers per strategy the cluster can hold
    print(table(rows))

describe.py: the dataclasses and PlanError; cost.py: predict, plan, table, TERMS; published.py: the published
scaling efficiencies predicted from their papers' inputs; lab.py: the lab's committed runs predicted, and notebook
07's lab checks; exercises.py: notebook 07's graders.
"""
from kit.plan.cost import TERMS, candidates, memory, plan, predict, table
from kit.plan.describe import KINDS, Cluster, Link, Model, PlanError, Strategy
from kit import _lazy_submodules

__all__ = ["KINDS", "TERMS", "Cluster", "Link", "Model", "PlanError", "Strategy", "candidates", "memory", "plan",
           "predict", "table"]
__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
