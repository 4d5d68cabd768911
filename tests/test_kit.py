"""The package itself: its floors (no import circle, nothing importing upward, small modules), every submodule
reachable by attribute from `kit` (found by walking the package, not from a list), every `kit.x.y` the README,
the docs, the notebooks and the docstrings name resolves; Triton before TensorFlow."""
import ast
import glob
import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kit

PKG = Path(kit.__path__[0])
REPO_DIR = PKG.parent
# The floors, bottom up: a module may import from its own floor or below, never above (docs/design.md).
FLOORS = [("kit", "kit.env", "kit.sysinfo", "kit.scratch", "kit.datasets", "kit.trace", "kit.checks"), ("kit.comm",),
          ("kit.cluster", "kit.plots"),
          ("kit.netlab", "kit.data"), ("kit.mnist", "kit.ddp", "kit.mp", "kit.plan"),
          ("kit.bench",)]
MAX_LINES = 350


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(kit.__path__, "kit.") if not m.name.endswith("__main__"))


def _floor(module: str) -> int:
    unit = module if module.count(".") < 1 else ".".join(module.split(".")[:2])
    for i, names in enumerate(FLOORS):
        if unit in names:
            return i
    raise AssertionError(f"{module}: on no floor of FLOORS (tests/test_kit.py, docs/design.md): add its package")


def _imports(module: str) -> set[str]:
    """The kit modules `module` imports (at the top or inside functions)."""
    path = PKG.parent / (module.replace(".", "/") + ("/__init__.py" if (PKG.parent / module.replace(".", "/")).is_dir()
                                                      else ".py"))
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("kit")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kit") and not node.level:
            for a in node.names:       # `from kit.x import y`: y is a module when it is one
                sub = f"{node.module}.{a.name}"
                out.add(sub if importlib.util.find_spec(node.module) and sub in _modules() else node.module)
    return out - {module}


def test_the_package_is_walked_and_every_module_is_on_a_floor():
    mods = _modules()
    assert {"kit.comm.ring", "kit.netlab.lab", "kit.bench.network", "kit.mnist.train"} <= set(mods)
    for m in mods:
        _floor(m)


@pytest.mark.parametrize("name", _modules())
def test_every_submodule_is_reachable_by_attribute(name):
    obj = kit
    for part in name.split(".")[1:]:
        obj = getattr(obj, part)
    assert obj is importlib.import_module(name)


def test_no_module_imports_from_a_floor_above_its_own():
    upward = [f"{m} -> {i}" for m in _modules() for i in _imports(m) if _floor(i) > _floor(m)]
    assert not upward, "imports that go up a floor:\n" + "\n".join(upward)


def test_no_import_circle():
    nodes = set(_modules())
    graph = {m: {i for i in _imports(m) if i in nodes} for m in nodes}
    # a package's __init__ re-exports its modules (the face); only module-to-module edges can make a circle
    graph = {m: {i for i in deps if not _is_package(i)} for m, deps in graph.items() if not _is_package(m)}
    seen, stack, circles = set(), [], []

    def visit(m):
        if m in stack:
            circles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for d in sorted(graph[m]):
            visit(d)
        stack.pop()
    for m in sorted(graph):
        visit(m)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def _is_package(name: str) -> bool:
    return (REPO_DIR / name.replace(".", "/")).is_dir()


def test_no_module_is_over_the_size_limit():
    sizes = {str(p.relative_to(REPO_DIR)): len(p.read_text().splitlines()) for p in PKG.rglob("*.py")}
    big = {path: n for path, n in sizes.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines (split them by concept): {big}"


def _named_in_text() -> dict[str, str]:
    """Every `kit.a.b...` written in the README, docs/, the notebooks' sources and kit's own files: {name: where}."""
    texts = {str(p.relative_to(REPO_DIR)): p.read_text() for p in
             [REPO_DIR / "README.md", *REPO_DIR.glob("docs/*.md"), *PKG.rglob("*.py")] if p.exists()}
    for nb in glob.glob(str(REPO_DIR / "notebooks/**/*.ipynb"), recursive=True):
        texts[os.path.relpath(nb, REPO_DIR)] = "\n".join("".join(c["source"]) for c in json.load(open(nb))["cells"])
    names = {}
    for where, text in texts.items():
        for m in re.finditer(r"(?<![\w./'\"-])kit(?:\.[A-Za-z_]\w*)+", text):
            names.setdefault(m.group(0), where)
    return names


def test_every_kit_name_the_docs_and_docstrings_write_resolves():
    bad = []
    for name, where in sorted(_named_in_text().items()):
        obj = kit
        for part in name.split(".")[1:]:
            if not hasattr(obj, part):
                if not isinstance(obj, type(kit)):  # an attribute of a class or function: not ours to check
                    break
                bad.append(f"{name} ({where}): no {part!r} in {obj.__name__}")
                break
            obj = getattr(obj, part)
    assert not bad, "names that do not resolve:\n" + "\n".join(bad)


def test_unknown_attribute_is_a_clear_attribute_error():
    with pytest.raises(AttributeError, match="module 'kit' has no attribute 'nope'"):
        kit.nope


def test_profile_loader_is_reachable_from_the_package():
    assert kit.profile_loader is importlib.import_module("kit.data.profiler").profile_loader


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


@pytest.mark.engines
def test_triton_loads_before_tensorflow_when_installed(tmp_path):
    # tensorflow/tensorflow#124205: Triton loaded after TensorFlow >= 2.20 segfaults; torch loads it lazily.
    assert _import_order(tmp_path, "import kit, tensorflow") == "['triton', 'tensorflow']"
    assert _import_order(tmp_path, "import kit, builtins; ORDER = builtins.__dict__.get('ORDER', [])") == "[]"
    assert _import_order(tmp_path, "import tensorflow, kit") == "['tensorflow']"   # too late: left alone


@pytest.mark.timeout(300)
@pytest.mark.engines
def test_tensorflow_then_a_torch_optimizer_in_one_process():
    """The real case (a plain user's PyPI CUDA torch brings Triton): this crashed with SIGSEGV before the hook."""
    code = ("import kit, tensorflow, torch\n"
            "torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])


def test_every_path_the_kit_gives_child_processes_holds_the_kit_package():
    """KIT_ROOT (PYTHONPATH of remote engines and lab servers) and kit.mnist.REPO (the jobs' working directory) are
    the folder that holds `kit`, never `kit/` itself: there `kit/comm` would shadow Jupyter's `comm` package."""
    from kit.netlab import exchange
    from kit.cluster import remote
    for path in (remote.KIT_ROOT, exchange.KIT_ROOT, str(kit.mnist.REPO)):
        assert os.path.isfile(os.path.join(path, "kit", "__init__.py")), path


def test_a_host_that_times_out_is_asked_again_and_one_that_refuses_is_not():
    """check_hosts: sshd on a loaded machine can miss the banner exchange (CI, 2026-12-03): ask again; a refusal is
    final at once."""
    import subprocess
    from kit.cluster import remote

    class Fake(remote.Remote):
        def run(self, host, cmd, timeout=30, connect=5):
            self.calls.append(host)
            if host == "slow" and self.calls.count("slow") < 2:
                return subprocess.CompletedProcess(cmd, 255, "", "Connection timed out during banner exchange\n")
            if host in ("off", "dead"):
                why = "Connection refused" if host == "off" else "Connection timed out during banner exchange"
                return subprocess.CompletedProcess(cmd, 255, "", f"ssh: connect to host {host} port 22: {why}\n")
            return subprocess.CompletedProcess(cmd, 0, "", "")

    fake = Fake()
    fake.calls = []
    down = remote.check_hosts(fake, ["up", "slow", "off", "dead"])
    assert set(down) == {"off", "dead"} and "refused" in down["off"] and "timed out" in down["dead"]
    assert sorted(fake.calls) == sorted(["up", "slow", "off", "dead", "slow", "dead", "dead"])
