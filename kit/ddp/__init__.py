"""Data parallelism from the ring to DDP, ZeRO and FSDP (notebook 05), as kit.mnist is notebook 04's: the schemes'
experiment on the engines (schemes), what each rank holds at its peak against ZeRO's formulas
(memory), the same on lab hosts with each lesson checked (lab), torchrun across hosts
(torchrun), overlap proved from torch.profiler traces (profile), Horovod's own timeline against DDP (horovod),
the exercises' graders (exercises). Its figures are
kit.plots.ddp's and kit.plots.trace's."""
from kit.ddp.schemes import (
    CFG, all_schemes, by_scheme, experiment, first, make_model, batch, max_diff, md, reference, setup, table)
from kit.ddp.horovod import horovod_rows, horovod_timeline, negotiation_rows
from kit.ddp.memory import memory_table
from kit import _lazy_submodules

__getattr__, __dir__ = _lazy_submodules(__name__, __path__, globals())
