#!/usr/bin/env python
"""Train the classic Keras MNIST CNN with Horovod: a thin entry point for `python -m kit.mnist.train`, whose
docstring and `--help` say how to run it (horovodrun, mpirun, elastic)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # find `kit` when run from a checkout
from kit.mnist.train import main

if __name__ == "__main__":
    main()
