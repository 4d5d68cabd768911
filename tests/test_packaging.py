"""environment.yml and Dockerfile.gpu cannot be built here (no conda, no Docker daemon): check that they pin
the same versions as pyproject.toml and use the same Horovod install script."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"\b([A-Za-z][A-Za-z0-9_.-]*)(?:\[[^\]]*\])?==([0-9][^\s\"',;]*)")


def pins(text: str) -> dict[str, str]:
    return {name.lower().replace("_", "-"): version for name, version in PIN.findall(text)}


def project_pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return pins("\n".join(deps))


def test_every_dependency_is_pinned_exactly():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert len(project_pins()) == len(deps) > 10, [d for d in deps if "==" not in d]


def test_environment_yml_pins_exactly_the_pyproject_versions():
    assert pins((ROOT / "environment.yml").read_text()) == project_pins()


def test_dockerfile_pins_agree_with_pyproject():
    docker = pins((ROOT / "Dockerfile.gpu").read_text())
    assert docker, "Dockerfile.gpu pins nothing"
    assert {k: project_pins()[k] for k in docker} == docker   # KeyError if it pins something pyproject lacks


def test_one_install_script_everywhere():
    for f in ("environment.yml", "scripts/setup_env.sh"):
        assert "scripts/install_horovod.sh" in (ROOT / f).read_text(), f
    assert "RUN make setup" in (ROOT / "Dockerfile.gpu").read_text()      # which runs setup_env.sh
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in (ROOT / "Dockerfile.gpu").read_text()
    # the file sections of the patch: 6 for the compat fixes 1-4 and the kit's torch-ops option, 28 headers
    # for fix 5 (GCC >= 13 includes), 1 for fix 6 (Python 3.12 has no distutils)
    assert (ROOT / "scripts/horovod-0.28.1-compat.patch").read_text().count("\n--- a/") == 6 + 28 + 1


def test_ci_runs_what_the_readme_says():
    ci = (ROOT / ".ci/run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make lab" in readme


# --- install anywhere (issue 16) and the GPU image (issue 14) ------------------------------------------------
import os
import subprocess


def stamp(**env) -> str:
    """The set-up stamp scripts/setup_env.sh would write for this environment (nothing is installed)."""
    out = subprocess.run(["bash", "scripts/setup_env.sh", "--print-stamp"], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_stamp_records_the_torch_build_and_the_gpu_operations():
    """A set-up with other choices is not 'up to date': make never keeps a CPU Horovod where NCCL was asked."""
    cases = [dict(TORCH=t, HOROVOD_GPU_OPERATIONS=g) for t in ("cpu", "cuda") for g in ("", "NCCL")]
    stamps = [stamp(**c) for c in cases]
    assert len(set(stamps)) == len(cases), dict(zip(map(str, cases), stamps))
    assert stamp(**cases[3]) == stamps[3]                     # and it is deterministic


def test_a_bad_torch_choice_is_a_clear_error():
    out = subprocess.run(["bash", "scripts/setup_env.sh"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "TORCH": "rocm", "VENV": "/nonexistent/venv"}, timeout=60)
    assert out.returncode != 0 and "TORCH must be auto, cpu or cuda" in out.stderr


def test_horovod_cache_key_records_gpu_ops_frameworks_and_torch_ops():
    script = (ROOT / "scripts/install_horovod.sh").read_text()
    key = next(line for line in script.splitlines() if line.startswith("key="))
    for part in ("$gpu_ops", "$torch_ops", "$tf_v", "$torch_v", "$patch_sum"):
        assert part in key, part
    assert "KIT_HOROVOD_TORCH_CUDA=0" in script                            # CUDA torch, no GPU: CPU ops
    assert 'STREQUAL "0"' in (ROOT / "scripts/horovod-0.28.1-compat.patch").read_text()


def test_docker_image_records_its_setup_and_ignores_host_state():
    docker = (ROOT / "Dockerfile.gpu").read_text()
    env_lines = " ".join(line for line in docker.splitlines() if line.startswith(("ENV", "    ")))
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in env_lines and "TORCH=cuda" in env_lines   # image-wide, not one RUN
    assert "RUN make setup" in docker            # the stamp is written by the same set-up `make lab` checks
    assert "install_horovod.sh" in (ROOT / "scripts/setup_env.sh").read_text()
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv/", ".git/"} <= set(ignored)
    assert "make test-gpu" in docker and "test-gpu:" in (ROOT / "Makefile").read_text()


def test_ci_runs_the_fresh_user_check():
    ci = (ROOT / ".ci/run").read_text()
    assert "scripts/ci_fresh_user.sh" in ci
    fresh = (ROOT / "scripts/ci_fresh_user.sh").read_text()
    for must in ("useradd", "su - ", "git clone", "make setup", "00_environment.ipynb", "make lab", "userdel"):
        assert must in fresh, must


def test_make_test_gpu_refuses_without_a_gpu():
    has_gpu = subprocess.run("nvidia-smi -L 2>/dev/null | grep -q ^GPU", shell=True).returncode == 0
    out = subprocess.run(["make", "-s", "gpu-present"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if has_gpu:
        assert out.returncode == 0, out.stderr
    else:
        assert out.returncode != 0 and out.stderr.strip().splitlines()[0].startswith("make test-gpu: no NVIDIA GPU")


def test_the_readme_gpu_table_is_what_results_gpu_json_measured():
    """The README's GPU numbers are the lent machine's run of `python -m kit.bench gpu`, not typed in by hand."""
    import json
    r = json.loads((ROOT / "results" / "gpu.json").read_text())
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("**Measured on a GPU**"):readme.index("What this says:")]
    assert r["gpu"] in table.replace("one NVIDIA H200", "NVIDIA H200")
    c = r["copy_gbps"]
    assert f"| {c['pageable']:.1f} GB/s | {c['pinned']:.1f} GB/s |" in table
    sweep = r["sweep"]
    lo, hi = "0", max(sweep["False"], key=int)
    def row(key, fmt):
        return " | ".join(f"{fmt(sweep[p][lo][key])} → {fmt(sweep[p][hi][key])}" for p in ("False", "True"))
    assert row("samples_per_s", lambda v: f"{v:.0f}") in table
    assert row("busy", lambda v: f"{100 * v:.0f}%") in table
    assert row("gpu_util", lambda v: f"{v:.1f}%") in table
    nccl, gloo = r["allreduce"]
    assert "error" in nccl and "invalid usage" in nccl["error"] and "invalid usage" in table
    assert f"{1000 * gloo['seconds']:.1f} ms, {gloo['busbw_gbps']:.1f} GB/s" in table


def test_the_readme_elastic_table_is_what_results_elastic_json_measured():
    """The README's elastic numbers are `python -m kit.bench elastic`'s, computed from its events."""
    import json
    from kit.mnist import elastic
    r = json.loads((ROOT / "results" / "elastic.json").read_text())
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Elastic Horovod on the lab"):readme.index("## Layout")]
    assert "> " + r["summary"] in section
    for i, run in enumerate(r["runs"], 1):
        again = elastic.summarize(run["events"], run["t_cut"], run["t_restore"])    # the events say the same
        assert again["lost_batches"] == run["lost_batches"] and again["pauses"] == run["pauses"]
        back = next((p["seconds"] for p in run["pauses"] if p["t"] > run["t_restore"]), 0.0)
        sizes = run["batches_at_size"]
        assert (f"| {i} | {run['seconds_to_carry_on']:.1f} s | {run['lost_batches'][0]} | "
                f"{run['seconds_to_rejoin']:.1f} s | {back:.1f} s | {sizes.get('1', 0)} / {sizes.get('2', 0)} | "
                f"{run['final_accuracy']:.3f} |") in section


def test_the_readme_network_tables_are_what_results_network_json_measured():
    """The README's network tables and summary line are `python -m kit.bench network`'s JSON, rendered."""
    import json
    from kit.plots.network import readme_tables
    x = json.loads((ROOT / "results" / "network.json").read_text())
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Ring and parameter server on a network"):readme.index("### 04 · Horovod")]
    assert readme_tables(x, max(x["sizes"])) in section
    assert "> " + x["summary"] in section


def test_the_readme_allreduce_table_is_what_results_allreduce_json_measured():
    """The README's loopback allreduce table and summary line are `python -m kit.bench allreduce`'s JSON."""
    import json
    from kit.bench.allreduce import readme_table
    x = json.loads((ROOT / "results" / "allreduce.json").read_text())
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index("### 03 · Ring-allreduce"), readme.index("### Ring and parameter server on a network")
    section = readme[start:end]
    assert readme_table(x) in section
    assert "> " + x["summary"] in section


def test_the_readme_mnist_table_is_what_results_mnist_json_measured():
    """The README's MNIST throughput table and summary line are `python -m kit.bench mnist`'s JSON."""
    import json
    from kit.mnist import readme_table
    x = json.loads((ROOT / "results" / "mnist.json").read_text())
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### 04 · Horovod Keras MNIST"):readme.index("### Elastic Horovod on the lab")]
    assert readme_table(x) in section
    assert "> " + x["summary"] in section


def test_the_readme_mnist_lab_table_is_what_results_mnist_lab_json_measured():
    """The README's MNIST-on-lab-hosts table and summary line are `python -m kit.bench mnist_lab`'s JSON."""
    import json
    from kit.mnist.lab import table
    x = json.loads((ROOT / "results" / "mnist_lab.json").read_text())
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### 04 · The MNIST job on lab hosts"):readme.index("### Elastic Horovod on the lab")]
    assert table(x) in section and f"K =\n{x['gradient_bytes']:,} bytes" in section
    assert "> " + x["summary"] in section
