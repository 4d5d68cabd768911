"""What a training step holds, measured in this process: parameters, gradients, optimizer state, and the
activations autograd keeps for backward; and the two levers beside the split, activation checkpointing and bf16.

    m = measure(model, x, y)                       # bytes of each, and the time of forward + backward
    m = measure(model, x, y, checkpoint=True)      # recompute each block in backward: fewer saved activations
    m = measure(model, x, y, bf16=True)            # torch.autocast("cpu", torch.bfloat16)
    with Saved(model.parameters()) as s: ...       # s.live, s.peak: the bytes autograd keeps, as it runs

Activations are counted once per tensor's memory (a tensor and its detached copies once), net of the parameters
(F.linear saves its weight for backward) and of copies cast from them (autocast's bf16 weights), from the moment
autograd saves them to the moment it frees them: `peak` is the most alive at once, backward's recompute included.
"""
from __future__ import annotations

import time

import torch


def nbytes(tensors) -> int:
    """Return the bytes of the given tensors."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Held:
    """One tensor autograd saved; its storage is released in `owner` when autograd drops it."""
    __slots__ = ("t", "key", "owner")

    def __init__(self, t, key, owner):
        self.t, self.key, self.owner = t, key, owner

    def __del__(self):
        if self.key is not None:
            self.owner._release(self.key)


class Saved:
    """A context that counts the bytes autograd keeps for backward, live and at their peak: each tensor once,
    parameters and tensors cast from them excluded (they are counted as `copies`)."""

    def __init__(self, params=()):
        self.params = list(params)
        self.skip = {_key(p) for p in self.params}
        self.refs: dict[tuple, list[int]] = {}       # (address, bytes) -> [bytes, tensors saved there]
        self.live = self.peak = self.copies = 0

    def _from_param(self, t) -> bool:
        node = t.grad_fn
        for _ in range(4):                           # views and casts of a parameter: its copy, not an activation
            if node is None:
                return False
            if type(node).__name__ == "AccumulateGrad":
                return any(node.variable is p for p in self.params)
            nxt = [n for n, _ in node.next_functions if n is not None]
            if len(nxt) != 1:
                return False
            node = nxt[0]
        return False

    def pack(self, t):
        if _key(t) in self.skip:
            return _Held(t, None, self)
        key = (t.data_ptr(), nbytes([t]))           # a tensor, its detached copies and same-sized views: once
        if key not in self.refs and self._from_param(t):
            self.skip.add(_key(t))
            self.copies += t.untyped_storage().nbytes()
            return _Held(t, None, self)
        ref = self.refs.setdefault(key, [key[1], 0])
        if ref[1] == 0:
            self.live += ref[0]
            self.peak = max(self.peak, self.live)
        ref[1] += 1
        return _Held(t, key, self)

    def _release(self, key):
        ref = self.refs[key]
        ref[1] -= 1
        if ref[1] == 0:
            self.live -= ref[0]
            del self.refs[key]

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda h: h.t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def stack(blocks: int = 8, d: int = 256, seed: int = 0) -> torch.nn.Sequential:
    """Return a stack of `blocks` MLP blocks (Linear(d, 4d), GELU, Linear(4d, d)), seeded."""
    from kit.mp import tensor
    return torch.nn.Sequential(*[tensor.mlp(d, 4 * d, seed + i) for i in range(blocks)])


def teacher_task(batch: int = 256, d: int = 256, seed: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """Return inputs and the targets a teacher (a stack of the same shape, seeded apart) gives them: a task whose
    loss can fall."""
    x = torch.randn(batch, d, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return x, stack(d=d, seed=seed)(x)


def forward(model, x, checkpoint: bool = False):
    """Run the stack block by block; with checkpoint, each block keeps only its input and recomputes its
    activations in backward (torch.utils.checkpoint, reentrant: the recompute saves through the active hooks)."""
    from torch.utils.checkpoint import checkpoint as ckpt
    if not checkpoint:
        return model(x)
    h = x.detach().requires_grad_(True)          # reentrant checkpointing needs an input that wants a gradient
    for block in model:
        h = ckpt(block, h, use_reentrant=True)
    return h


def measure(model, x, y, *, checkpoint: bool = False, bf16: bool = False, reps: int = 3) -> dict:
    """Run forward, backward and one Adam step; return the bytes of params, grads, optimizer state, the peak of
    the activations autograd keeps (forward and backward), the bf16 weight copies, the median time of forward +
    backward, and the loss."""
    secs = []
    for _ in range(reps):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        with Saved(model.parameters()) as saved:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = torch.nn.functional.mse_loss(forward(model, x, checkpoint).float(), y)
            loss.backward()
        secs.append(time.perf_counter() - t0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt.step()
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    return {"params": nbytes(model.parameters()), "grads": nbytes(p.grad for p in model.parameters()),
            "optimizer": nbytes(state), "activations": saved.peak, "copies": saved.copies,
            "ms": 1e3 * sorted(secs)[len(secs) // 2], "loss": loss.detach().item()}


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
