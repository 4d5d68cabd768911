"""Tensor parallelism by hand (Megatron-LM): the f and g operators, column- and row-parallel linear layers.

    col = ColumnParallelLinear(full_linear_1)     # this rank's rows of W1 (a slice of the hidden units)
    row = RowParallelLinear(full_linear_2)        # this rank's columns of W2 (the same slice)
    y = row(relu(col(x)))                         # one allreduce forward (g), one backward (f)

Sizes need not divide: rank r gets torch.tensor_split's r-th slice (the first `size % world` ranks one more unit),
and column and row layers split the same hidden dimension the same way, so their slices match.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _allreduce(t: torch.Tensor, group=None) -> torch.Tensor:
    t = t.contiguous().clone()
    dist.all_reduce(t, group=group)
    return t


class CopyToTP(torch.autograd.Function):
    """Megatron's f: identity in forward, allreduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _allreduce(grad, ctx.group), None


class ReduceFromTP(torch.autograd.Function):
    """Megatron's g: allreduce in forward, identity in backward."""

    @staticmethod
    def forward(ctx, x, group=None):
        return _allreduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def f(x, group=None):
    """Apply Megatron's f (identity forward, allreduce backward)."""
    return CopyToTP.apply(x, group)


def g(x, group=None):
    """Apply Megatron's g (allreduce forward, identity backward)."""
    return ReduceFromTP.apply(x, group)


def world(group=None) -> tuple[int, int]:
    """Return (rank, size) in `group` (the default group if None)."""
    return dist.get_rank(group), dist.get_world_size(group)


def shard(t: torch.Tensor, dim: int, rank: int, size: int, what: str = "tensor") -> torch.Tensor:
    """Return rank's slice of t along dim (torch.tensor_split: sizes differ by at most one)."""
    if t.shape[dim] < size:
        raise ValueError(f"{what} has {t.shape[dim]} units along dim {dim}, fewer than the {size} tensor-parallel "
                         f"ranks: every rank needs at least one (use at most {t.shape[dim]} ranks)")
    return torch.tensor_split(t, size, dim=dim)[rank].detach().clone()


class ColumnParallelLinear(torch.nn.Module):
    """y_r = f(x) @ W_r.T + b_r: this rank's slice of the output units (W's rows); input whole, output sharded."""

    def __init__(self, full: torch.nn.Linear, group=None):
        super().__init__()
        self.group = group
        rank, size = world(group)
        self.weight = torch.nn.Parameter(shard(full.weight, 0, rank, size, "out_features"))
        self.bias = None if full.bias is None else torch.nn.Parameter(shard(full.bias, 0, rank, size, "bias"))

    def forward(self, x):
        return torch.nn.functional.linear(f(x, self.group), self.weight, self.bias)


class RowParallelLinear(torch.nn.Module):
    """y = g(x_r @ W_r.T) + b: this rank's slice of the input units (W's columns); input sharded, output whole."""

    def __init__(self, full: torch.nn.Linear, group=None):
        super().__init__()
        self.group = group
        rank, size = world(group)
        self.weight = torch.nn.Parameter(shard(full.weight, 1, rank, size, "in_features"))
        self.bias = None if full.bias is None else torch.nn.Parameter(full.bias.detach().clone())

    def forward(self, x):
        y = g(torch.nn.functional.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


def mlp(d: int = 64, hidden: int | None = None, seed: int = 0) -> torch.nn.Sequential:
    """Return the unsharded MLP block, Linear(d, hidden) - GELU - Linear(hidden, d), seeded."""
    torch.manual_seed(seed)
    hidden = hidden or 4 * d
    return torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d))


def parallel_mlp(full: torch.nn.Sequential, column=ColumnParallelLinear, row=RowParallelLinear, group=None):
    """Return the tensor-parallel copy of `full` (Linear, act, Linear): column layer, the same act, row layer."""
    return torch.nn.Sequential(column(full[0], group=group), full[1], row(full[2], group=group))


def full_grads(tp: torch.nn.Sequential, group=None) -> list[torch.Tensor]:
    """Return the gradients of tp's parameters gathered into the unsharded layer's shapes (call on every rank)."""
    rank, size = world(group)
    out = []
    for layer, dim in ((tp[0], 0), (tp[2], 1)):
        for name in ("weight", "bias"):
            p = getattr(layer, name)
            if p is None:
                continue
            d = dim if name == "weight" else (0 if dim == 0 else None)
            if d is None:                       # the row layer's bias is whole on every rank
                out.append(p.grad.detach().clone())
                continue
            parts = [None] * size
            dist.all_gather_object(parts, p.grad.detach(), group=group)
            out.append(torch.cat(parts, dim=d))
    return out


def compare(tp: torch.nn.Sequential, full: torch.nn.Sequential, x: torch.Tensor, group=None,
            atol: float = 1e-5) -> dict:
    """Run forward and backward on tp and on full with the same x; return the largest differences (every rank)."""
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    ya, yb = tp(xa), full(xb)
    ya.pow(2).sum().backward()
    yb.pow(2).sum().backward()
    ga, gb = full_grads(tp, group), [p.grad for p in full.parameters()]
    diffs = {"out": float((ya - yb).abs().max()), "dx": float((xa.grad - xb.grad).abs().max()),
             "grads": max(float((a - b).abs().max()) for a, b in zip(ga, gb))}
    diffs["ok"] = max(diffs["out"], diffs["dx"], diffs["grads"]) <= atol
    return diffs
