"""What the learner sees in JupyterLab: notebook 00 run by JupyterLab's own "Run All Cells" in a real browser.

nbval checks what a kernel returns; this checks the screen. `scripts/lab.sh` (what `make lab` runs) serves a temp
copy of notebook 00 on 127.0.0.1; headless Chromium (Debian's chromium + chromium-driver, which `make setup`
installs when run as root) opens it through selenium and runs `notebook:run-all-cells`. Every code cell must
have run, in order, with no error output and no stderr output area: neither the kernel's own stderr nor an
engine's `[stderr:N]` stream under a `%%px` cell; the `# NBVAL_CHECK_OUTPUT` cells must print what the
committed notebook holds (nbval leaves notebook 00 to this test where it runs: tests/conftest.py). A screenshot is
taken into the test's temp dir; the browser, the server, its kernel and the temp dir are all gone afterwards.
"""
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from conftest import find_browser

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = "00_environment.ipynb"
RUN_ALL_SECONDS = 1500     # notebook 00, its lab section included: 7-15 minutes on a shared 2-core machine

# The notebook panel JupyterLab shows, read through its models (what is rendered on screen) and its DOM; found
# among the main area's widgets (shell.currentWidget follows the focus, which a headless browser need not give).
JS_NOTEBOOK = """const app = window.jupyterapp;
const nb = app && Array.from(app.shell.widgets('main')).find(w => w.content && w.sessionContext);"""
JS_KERNEL = JS_NOTEBOOK + """
const k = nb && nb.sessionContext.session && nb.sessionContext.session.kernel;
return k ? k.status : null;"""
JS_RUN_ALL = JS_NOTEBOOK + """
app.shell.activateById(nb.id);
window.__kitRunAll = null;
app.commands.execute('notebook:run-all-cells').then(
    ok => { window.__kitRunAll = {ok: ok}; }, err => { window.__kitRunAll = {error: String(err)}; });"""
JS_STATE = JS_NOTEBOOK + """
const code = nb.content.widgets.filter(c => c.model.type === 'code');
const k = nb.sessionContext.session && nb.sessionContext.session.kernel;
return {done: window.__kitRunAll, kernel: k ? k.status : null,
        counts: code.map(c => c.model.executionCount),
        outputs: code.map(c => c.model.outputs.toJSON()),
        running: [...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')].filter(
            p => p.textContent.includes('*')).length,
        stderr_areas: document.querySelectorAll(
            '.jp-Notebook .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').length};"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




def start_lab(tmp: Path, port: int, token: str) -> subprocess.Popen:
    """Serve tmp/notebooks with scripts/lab.sh (what `make lab` runs), its JupyterLab state kept in tmp."""
    (tmp / "scripts").mkdir()
    (tmp / "notebooks").mkdir()
    shutil.copy(REPO / "scripts" / "lab.sh", tmp / "scripts" / "lab.sh")
    shutil.copy(REPO / "notebooks" / NOTEBOOK, tmp / "notebooks" / NOTEBOOK)
    (tmp / "config").mkdir()
    # window.jupyterapp, through which the test runs JupyterLab's own command (off by default)
    (tmp / "config" / "jupyter_server_config.json").write_text(
        json.dumps({"LabApp": {"expose_app_in_browser": True}}))
    env = {**os.environ, "VENV": sys.prefix, "LAB_PORT": str(port), "JUPYTER_TOKEN": token,
           "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",        # what the Makefile exports
           "JUPYTER_CONFIG_PATH": str(tmp / "config"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces")}
    with open(tmp / "lab.log", "wb") as log:
        return subprocess.Popen(["bash", str(tmp / "scripts" / "lab.sh")], env=env, stdout=subprocess.DEVNULL,
                                stderr=log, start_new_session=True)


def wait_for_server(proc, port, token, tmp, seconds=180):
    deadline = time.time() + seconds
    while time.time() < deadline:
        assert proc.poll() is None, "JupyterLab exited early:\n" + (tmp / "lab.log").read_text()[-3000:]
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=5)
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer on 127.0.0.1:{port} within {seconds} s")


def stop_lab(proc, port, token):
    """Shut the kernels down as the learner would (so they stop their engines), then the server; reap all."""
    below = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    api = f"http://127.0.0.1:{port}/api/kernels"
    try:
        for k in json.load(urllib.request.urlopen(f"{api}?token={token}", timeout=10)):
            urllib.request.urlopen(urllib.request.Request(f"{api}/{k['id']}?token={token}", method="DELETE"),
                                   timeout=60)
    except OSError:
        pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    _, alive = psutil.wait_procs(below, timeout=30)
    for p in alive:                       # anything the server started that outlived it
        p.kill()
    psutil.wait_procs(alive, timeout=10)


def open_browser(chromium, driver, tmp):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,2200", f"--user-data-dir={tmp / 'chromium'}"):
        opts.add_argument(arg)
    # the driver's path given: selenium's manager downloads nothing; TMPDIR keeps Chromium's scratch files in tmp
    service = Service(executable_path=driver, log_output=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(tmp)})
    return webdriver.Chrome(options=opts, service=service)


def wait_until(browser, script, ok, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = browser.execute_script(script)
        if ok(value):
            return value
        time.sleep(2)
    pytest.fail(f"{what} not within {seconds} s (last: {str(value)[:500]})")


JS_SCREEN = """const d = document.querySelector('.jp-Dialog');
return {dialog: d ? d.innerText : null, app: !!window.jupyterapp,
        tabs: [...document.querySelectorAll('.lm-TabBar-tabLabel')].map(t => t.innerText)};"""


def open_notebook(browser, url, tmp, seconds=120, attempts=2):
    """Open the notebook as the learner does and wait until its kernel is idle. Seen once in a fresh-clone run of the
    whole suite (the machine fully busy): no notebook kernel 180 s after the page was asked for, with nothing on
    record to say why; what is on screen and the server's log are now printed, and the page is loaded once more,
    as a learner would reload it. A notebook that does not open at all still fails."""
    for attempt in range(1, attempts + 1):
        browser.get(url)
        deadline = time.time() + seconds
        while time.time() < deadline:
            if browser.execute_script(JS_KERNEL) == "idle":
                return
            time.sleep(2)
        print(f"\nattempt {attempt}: no idle notebook kernel within {seconds} s; on screen: "
              f"{browser.execute_script(JS_SCREEN)}; JupyterLab's log (the end):\n"
              f"{(tmp / 'lab.log').read_text(errors='replace')[-2000:]}")
    pytest.fail(f"notebook open with an idle kernel not within {attempts} loads of {seconds} s each (above: the "
                "screen and the server's log)")


def checked_text(outputs) -> list[tuple[str, str]]:
    """What nbval compares in a `# NBVAL_CHECK_OUTPUT` cell: each stream's text (consecutive chunks of one stream
    joined, as nbval does) and each result's text/plain, in order."""
    out = []
    for o in outputs:
        if o["output_type"] == "stream":
            kind, text = o["name"], o["text"]
        elif o["output_type"] in ("execute_result", "display_data") and "text/plain" in o.get("data", {}):
            kind, text = o["output_type"], o["data"]["text/plain"]
        else:
            continue
        text = "".join(text) if isinstance(text, list) else text
        if out and kind in ("stdout", "stderr") and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out


def stderr_texts(outputs):
    """Return the stderr the learner would see in one cell's outputs: kernel stderr and engines' [stderr:N]."""
    out = []
    for o in outputs:
        if o["output_type"] == "stream" and o["name"] == "stderr":
            out.append(o["text"])
        text = o.get("data", {}).get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else text
        if text.startswith("[stderr:"):
            out.append(text)
    return out


@pytest.mark.timeout(RUN_ALL_SECONDS + 600)
@pytest.mark.browser
@pytest.mark.engines
def test_notebook_00_runs_clean_in_jupyterlab(no_leaks):
    chromium, driver = find_browser('the JupyterLab UI test')
    tmp = Path(tempfile.mkdtemp(prefix="kit-ui-"))
    port, token = free_port(), secrets.token_hex(24)
    proc = browser = None
    try:
        proc = start_lab(tmp, port, token)
        wait_for_server(proc, port, token, tmp)
        browser = open_browser(chromium, driver, tmp)
        open_notebook(browser, f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK}?token={token}", tmp)
        browser.execute_script(JS_RUN_ALL)
        state = wait_until(browser, JS_STATE, lambda s: s["done"] is not None and s["kernel"] == "idle"
                           and not s["running"], RUN_ALL_SECONDS, "Run All Cells finished")
        browser.save_screenshot(str(tmp / "notebook00.png"))
        assert (tmp / "notebook00.png").stat().st_size > 0

        n = len(state["counts"])
        want = sum(c["cell_type"] == "code" for c in json.loads((REPO / "notebooks" / NOTEBOOK).read_text())["cells"])
        assert n == want, f"JupyterLab shows {n} code cells, the notebook has {want}"
        errors = {i: f"{o['ename']}: {o['evalue']}" for i, outs in enumerate(state["outputs"])
                  for o in outs if o["output_type"] == "error"}
        if errors:   # what the learner reads under the cell: engines' tracebacks (%%px) or the kernel's, and stderr
            shown = {i: [str(o.get("text") or o.get("traceback") or o.get("data", {}).get("text/plain", ""))[-1500:]
                         for o in state["outputs"][i]] for i in errors}
            errors = {i: (e, shown[i]) for i, e in errors.items()}
        assert not errors, f"error outputs (code cell index: error): {errors}"
        assert state["counts"] == list(range(1, n + 1)), f"not every code cell ran, in order: {state['counts']}"
        assert state["done"] == {"ok": True}, f"notebook:run-all-cells reported {state['done']}"
        # nbval does not run notebook 00 where this test runs (tests/conftest.py): its checked cells are compared here
        code = [c for c in json.loads((REPO / "notebooks" / NOTEBOOK).read_text())["cells"] if c["cell_type"] == "code"]
        checked = [i for i, c in enumerate(code) if "".join(c["source"]).startswith("# NBVAL_CHECK_OUTPUT")]
        differ = {i: (checked_text(state["outputs"][i]), checked_text(code[i]["outputs"])) for i in checked
                  if checked_text(state["outputs"][i]) != checked_text(code[i]["outputs"])}
        assert checked and not differ, f"# NBVAL_CHECK_OUTPUT cells differ (index: (now, committed)): {differ}"
        stderr = {i: t for i, outs in enumerate(state["outputs"]) if (t := stderr_texts(outs))}
        assert not stderr, f"stderr shown under code cells (index: text): {json.dumps(stderr)[:3000]}"
        assert state["stderr_areas"] == 0, f"{state['stderr_areas']} stderr output area(s) on screen"
    finally:
        if browser is not None:
            browser.quit()
        if proc is not None:
            stop_lab(proc, port, token)
        shutil.rmtree(tmp, ignore_errors=True)



# What the engines' stderr filter (kit.env.quiet_native_stderr) lets through, in a child process: fast, no browser.
BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
INFO = "I0000 00:00:1796020754.784409   24363 cudart_stub.cc:31] Could not find cuda drivers on your machine."
WARN = "W1130 08:45:01.123456   24363 some_op.cc:7] a warning"
CUINIT = "E0000 00:00:1796020763.278299   24363 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)"
ERROR = "E1130 08:45:01.123456   24363 gloo.cc:12] a real error"
FILTER_CHILD = """
import os, sys, time
from kit.env import quiet_native_stderr
quiet_native_stderr()
os.write(2, sys.argv[1].encode())
time.sleep(1)     # the partial last line goes on after 0.2 s
"""


@pytest.mark.parametrize("level, cuda, kept", [
    ("2", "", [ERROR, "plain C output", "a partial line"]),                     # what kit.cluster's engines get
    ("0", "", [INFO, WARN, ERROR, "plain C output", "a partial line"]),         # INFO shown, CPU engine: no cuInit
    ("2", "0", [CUINIT, ERROR, "plain C output", "a partial line"]),            # a GPU engine: cuInit failing counts
])
@pytest.mark.engines
def test_engines_drop_only_tensorflow_start_up_noise(level, cuda, kept):
    if cuda and not os.path.exists("/proc/driver/nvidia/version"):
        kept = [k for k in kept if k != CUINIT]      # no NVIDIA driver here: a CPU machine, cuInit failing is noise
    written = "\n".join([BANNER, INFO, WARN, CUINIT, ERROR, "plain C output", "a partial line"])
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": level, "CUDA_VISIBLE_DEVICES": cuda,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", FILTER_CHILD, written], env=env, capture_output=True, timeout=60)
    assert out.stderr.decode().splitlines() == kept


def test_checked_text_is_what_nbval_compares():
    outs = [{"output_type": "stream", "name": "stdout", "text": ["a\n", "b"]},
            {"output_type": "stream", "name": "stdout", "text": "c\n"},             # joined with the chunk before
            {"output_type": "display_data", "data": {"image/png": "...", "text/plain": "<Figure>"}},
            {"output_type": "stream", "name": "stdout", "text": "d\n"},
            {"output_type": "display_data", "data": {"image/png": "..."}}]          # no text: nothing to compare
    assert checked_text(outs) == [("stdout", "a\nbc\n"), ("display_data", "<Figure>"), ("stdout", "d\n")]
    assert checked_text(outs) != checked_text(outs[:1])
