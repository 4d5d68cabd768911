"""The classic MNIST CNN in PyTorch (notebook 04a's appendix and the GPU test)."""


def torch_model():
    """Return the classic MNIST CNN in PyTorch (same layers as build_model)."""
    import torch.nn as nn
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 10))
