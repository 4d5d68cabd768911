"""What a training step holds, measured in this process: parameters, gradients, optimizer state, saved
activations; and the two levers beside the split, activation checkpointing and bf16 autocast.

    m = measure(model, x, y)                       # bytes of each, and the time of forward + backward
    m = measure(model, x, y, checkpoint=True)      # recompute each block in backward: fewer saved activations
    m = measure(model, x, y, bf16=True)            # torch.autocast("cpu", torch.bfloat16)
"""
from __future__ import annotations

import time

import torch


def nbytes(tensors) -> int:
    """Return the bytes of the given tensors."""
    return sum(t.numel() * t.element_size() for t in tensors)


def stack(blocks: int = 8, d: int = 256, seed: int = 0) -> torch.nn.Sequential:
    """Return a stack of `blocks` MLP blocks (Linear(d, 4d), GELU, Linear(4d, d)), seeded."""
    from kit.mp import tensor
    return torch.nn.Sequential(*[tensor.mlp(d, 4 * d, seed + i) for i in range(blocks)])


def forward(model, x, checkpoint: bool = False, held: list | None = None):
    """Run the stack block by block; with checkpoint, each block's activations are recomputed in backward and
    only its input is kept (counted into held[0])."""
    from torch.utils.checkpoint import checkpoint as ckpt
    h = x
    for block in model:
        if checkpoint:
            if held is not None:
                held[0] += nbytes([h])
            h = ckpt(block, h, use_reentrant=False)
        else:
            h = block(h)
    return h


def measure(model, x, y, *, checkpoint: bool = False, bf16: bool = False, reps: int = 3) -> dict:
    """Run forward, backward and one Adam step; return the bytes of params, grads, optimizer state, activations
    saved for backward (at their peak, end of forward), the median time of forward + backward, and the loss."""
    held = [0]

    def pack(t):
        held[0] += nbytes([t])
        return t
    secs, loss = [], None
    for _ in range(reps):
        model.zero_grad(set_to_none=True)
        held[0] = 0
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = forward(model, x, checkpoint, held)
                loss = torch.nn.functional.mse_loss(out.float(), y)
        saved = held[0]
        loss.backward()
        secs.append(time.perf_counter() - t0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt.step()
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    return {"params": nbytes(model.parameters()), "grads": nbytes(p.grad for p in model.parameters()),
            "optimizer": nbytes(state), "activations": saved, "ms": 1e3 * sorted(secs)[len(secs) // 2],
            "loss": loss.detach().item()}


def train_losses(model, x, y, steps: int = 20, bf16: bool = False, lr: float = 1e-3) -> list[float]:
    """Train `steps` Adam steps on (x, y), with or without bf16 autocast; return the losses."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        out.append(loss.detach().item())
    return out
