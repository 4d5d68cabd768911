"""`make lab` prints a URL; JupyterLab serves the notebooks there; stopping it leaves nothing behind."""
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.engines      # runs `make lab`: a JupyterLab server
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_serves_the_notebooks(no_leaks):
    port = free_port()
    proc = subprocess.Popen(["make", "-s", "lab", f"LAB_PORT={port}"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        url = None
        deadline = time.time() + 120
        while url is None and time.time() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "make lab exited early"
            m = re.search(r"(http://127\.0\.0\.1:\d+/lab\?token=\w+)", line)
            url = m and m.group(1)
        assert url, "make lab printed no URL"
        token = url.split("token=")[1]
        page = None
        while page is None and time.time() < deadline:
            try:
                page = urllib.request.urlopen(url, timeout=5).read().decode()
            except OSError:
                time.sleep(0.5)
        assert page and "JupyterLab" in page
        api = f"http://127.0.0.1:{port}/api/contents?token={token}"
        names = {item["name"] for item in json.load(urllib.request.urlopen(api, timeout=10))["content"]}
        assert "00_environment.ipynb" in names
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
