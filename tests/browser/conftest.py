"""A real JupyterLab server and a real headless Chromium, shared by the browser tests.

The server runs from this venv on loopback with a random token, over a copy of the
examples, with its own job home. Chromium is Debian's (`make test` installs it with
apt-get); Playwright drives it (its own browser download is not possible here).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.browser.chromium import chromium, run_all_cells

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class Lab:
    def __init__(self, url: str, token: str, root: Path, home: Path):
        self.url, self.token, self.root, self.home = url, token, root, home

    def page_url(self, path: str) -> str:
        return f"{self.url}/{path}?token={self.token}"

    def run_all_cells(self, page) -> None:
        """Wait for the open notebook's kernel, then Run ▸ Run All Cells."""
        run_all_cells(page)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    home = tmp_path_factory.mktemp("lab-home")
    for notebook in EXAMPLES.glob("*.ipynb"):
        if not notebook.name.endswith(".executed.ipynb"):
            shutil.copy(notebook, root / notebook.name)
    token = secrets.token_hex(16)
    settings = root / ".settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)  # no "get notified about Jupyter news?" toast
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    env = {
        **os.environ,
        "ELASTICDL_NB_HOME": str(home),
        "JUPYTER_CONFIG_DIR": str(root / ".jupyter"),
        "JUPYTERLAB_SETTINGS_DIR": str(root / ".settings"),
        "JUPYTER_RUNTIME_DIR": str(root / ".runtime"),  # where it says which port it got
    }
    log = open(root / "lab.log", "w")  # noqa: SIM115  (closed below)
    server = subprocess.Popen(
        [
            sys.executable, "-m", "jupyterlab",
            # Port 0: the server binds one the OS gives it (a port picked here and
            # handed over could be taken meanwhile, and it would move to another).
            "--no-browser", "--allow-root", "--ip=127.0.0.1", "--port=0",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
            "--LabApp.expose_app_in_browser=True",  # window.jupyterapp: run commands by id
        ],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    info = root / ".runtime" / f"jpserver-{server.pid}.json"
    deadline = time.monotonic() + 60
    while True:
        try:
            url = json.loads(info.read_text())["url"].rstrip("/")
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except (OSError, ValueError, KeyError):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(
                    "jupyter lab did not start: " + (root / "lab.log").read_text()[-2000:]
                ) from None
            time.sleep(0.3)
    yield Lab(url, token, root, home)
    server.terminate()
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()
    with pytest.MonkeyPatch.context() as patch:  # no job of the browser tests outlives them
        patch.setenv("ELASTICDL_NB_HOME", str(home))
        import elasticdl_nb as edl

        for job in edl.jobs():
            if job["state"] == "running":
                edl.attach(job["name"]).stop()


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched
