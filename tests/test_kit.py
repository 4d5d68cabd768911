"""The package itself: every submodule `kit` advertises imports (lazily, by attribute); Triton before TensorFlow."""
import importlib
import os
import subprocess
import sys

import pytest

import kit


@pytest.mark.parametrize("name", kit._SUBMODULES)
def test_every_advertised_submodule_imports(name):
    module = getattr(kit, name)
    assert module is importlib.import_module(f"kit.{name}")


def test_unknown_attribute_is_a_clear_attribute_error():
    with pytest.raises(AttributeError, match="module 'kit' has no attribute 'nope'"):
        kit.nope


def test_profile_loader_is_reachable_from_the_package():
    assert kit.profile_loader is importlib.import_module("kit.profiler").profile_loader


def _import_order(tmp_path, code):
    """Run `code` in a fresh Python where stand-in `triton` and `tensorflow` packages record their import order."""
    for name in ("triton", "tensorflow"):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "__init__.py").write_text(
            "import builtins\nbuiltins.__dict__.setdefault('ORDER', []).append(__name__)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.path.dirname(kit.__path__[0])])}
    out = subprocess.run([sys.executable, "-c", code + "\nprint(ORDER)"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_triton_loads_before_tensorflow_when_installed(tmp_path):
    # tensorflow/tensorflow#124205: Triton loaded after TensorFlow >= 2.20 segfaults; torch loads it lazily.
    assert _import_order(tmp_path, "import kit, tensorflow") == "['triton', 'tensorflow']"
    assert _import_order(tmp_path, "import kit, builtins; ORDER = builtins.__dict__.get('ORDER', [])") == "[]"
    assert _import_order(tmp_path, "import tensorflow, kit") == "['tensorflow']"   # too late: left alone


@pytest.mark.timeout(300)
def test_tensorflow_then_a_torch_optimizer_in_one_process():
    """The real case (a plain user's PyPI CUDA torch brings Triton): this crashed with SIGSEGV before the hook."""
    code = ("import kit, tensorflow, torch\n"
            "torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])
