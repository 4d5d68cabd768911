"""TensorFlow for the MNIST jobs: imported with its C++ start-up log silenced, and tf.keras (the Keras 2 API that
Horovod supports; importing kit selected it)."""
from __future__ import annotations

import os
import sys


def import_tf_quietly():
    """Import TensorFlow and list its devices with the C++ start-up log lines (fd 2) silenced; return tf."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        import tensorflow as tf
        tf.config.list_physical_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    return tf


def keras():
    """Return tf.keras (the Keras 2 API that Horovod supports)."""
    import tensorflow as tf
    return tf.keras
