"""The MNIST-shaped MLP that every parameter-server process trains (notebook 02), and its single-process reference.

Every process builds the same model from the same seed and reads the same fixed shuffle of the data, so a run
on N workers can be compared number for number with `train_single`.
"""
from __future__ import annotations

import numpy as np


def make_model(hidden: int = 128, seed: int = 0):
    """Build the MNIST-shaped MLP, initialised from `seed` (so every process starts from the same weights)."""
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 10))


def get_flat(model):
    """Return the model's parameters as one flat float32 vector (a copy)."""
    import torch
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def set_flat(model, flat):
    """Copy a flat vector into the model's parameters."""
    import torch
    torch.nn.utils.vector_to_parameters(flat, model.parameters())


def load_train(data: str = "auto"):
    """Return the training images (float, 0..1) and labels as torch tensors."""
    import torch
    from kit import datasets
    ds = datasets.load(data, verbose=False)
    return torch.from_numpy(ds.x_train).float().div_(255), torch.from_numpy(ds.y_train)


def batch_indices(step: int, batch: int, n: int, seed: int = 0):
    """Return the sample indices of global batch `step` (a fixed shuffle, read cyclically)."""
    import torch
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[(step * batch + torch.arange(batch)) % n]


def local_part(idx, worker: int, workers: int):
    """Return worker's contiguous 1/N of a global batch's indices."""
    size = len(idx) // workers
    return idx[worker * size:(worker + 1) * size]


def gradient(model, x, y):
    """Run forward and backward on (x, y); return (loss, flat gradient)."""
    import torch
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.item(), torch.cat([p.grad.reshape(-1) for p in model.parameters()])

def train_single(cfg) -> tuple[np.ndarray, list[float]]:
    """Reference: plain single-process SGD on the whole global batch of `cfg` (a `kit.comm.ps.Config`); return (flat
    parameters, losses)."""
    model, (x, y) = make_model(cfg.hidden, cfg.seed), load_train(cfg.data)
    params, losses = get_flat(model), []
    for step in range(cfg.steps):
        set_flat(model, params)
        loss, grad = gradient(model, *(t[batch_indices(step, cfg.batch, len(x), cfg.seed)] for t in (x, y)))
        params -= cfg.lr * grad
        losses.append(loss)
    return params.numpy(), losses


def accuracy(params: np.ndarray, cfg) -> float:
    """Return the test accuracy of flat parameters `params` for cfg's model."""
    import torch
    from kit import datasets
    ds = datasets.load(cfg.data, verbose=False)
    model = make_model(cfg.hidden, cfg.seed)
    set_flat(model, torch.from_numpy(params))
    with torch.no_grad():
        pred = model(torch.from_numpy(ds.x_test).float() / 255).argmax(1).numpy()
    return float((pred == ds.y_test).mean())
