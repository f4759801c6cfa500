"""The package brings its Jupyter extensions: in this venv (the Makefile's editable
install plus its labextension link), Jupyter lists the sidebar (labextension/) and the
job API (elasticdl_nb/server/) as enabled and OK; and a wheel carries both, the built
extension and the server extension's config, as data for share/ and etc/."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

JUPYTER = Path(sys.executable).with_name("jupyter")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
HINT = "`make test` (or `make labextension`) builds the extension and installs it in .venv"


def _jupyter(*args: str) -> str:
    """What `jupyter ARGS` prints (these commands write their lists to stderr)."""
    done = subprocess.run(
        [str(JUPYTER), *args], capture_output=True, text=True, timeout=120, check=True
    )
    return ANSI.sub("", done.stdout + done.stderr)


def test_jupyterlab_lists_the_sidebar_extension_enabled_and_ok():
    listed = _jupyter("labextension", "list")
    line = next((x for x in listed.splitlines() if "elasticdl-nb" in x), None)
    assert line is not None, f"elasticdl-nb is not installed in the venv: {HINT}\n{listed}"
    assert re.search(r"elasticdl-nb v\d+\.\d+\.\d+ enabled\s+OK", line), line


def test_jupyter_server_lists_the_job_api_extension_enabled_and_ok():
    listed = _jupyter("server", "extension", "list")
    assert re.search(r"elasticdl_nb\.server\s+enabled", listed), listed
    assert re.search(r"elasticdl_nb\.server\s+OK", listed), listed


@pytest.mark.slow
def test_the_wheel_carries_the_built_extension_and_the_server_config(tmp_path):
    built = REPO / "elasticdl_nb" / "labextension" / "static" / "style.js"
    assert built.exists(), f"the extension is not built: {HINT}"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path),
         str(REPO)],
        check=True, timeout=600,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("elasticdl_nb-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = "-".join(wheel.name.split("-")[:2]) + ".data/data"  # elasticdl_nb-0.1.0.data/data
    labext = f"{data}/share/jupyter/labextensions/elasticdl-nb"
    assert f"{data}/etc/jupyter/jupyter_server_config.d/elasticdl_nb.json" in names
    assert {
        f"{labext}/package.json",
        f"{labext}/install.json",
        f"{labext}/schemas/elasticdl-nb/plugin.json",
        f"{labext}/static/style.js",
    } <= names
    assert any(re.fullmatch(rf"{labext}/static/remoteEntry\.[0-9a-f]+\.js", n) for n in names)
    assert "elasticdl_nb/runtime/protocol/elasticdl.proto" in names
    assert "elasticdl_nb/server/handlers.py" in names
    assert not any(n.startswith("elasticdl_nb/labextension/") for n in names)  # data, not code
    # The wheel's extension is the one built from labextension/ now, not a stale copy.
    remote_entries = {Path(n).name for n in names if "/static/remoteEntry." in n}
    assert remote_entries == {p.name for p in built.parent.glob("remoteEntry.*.js")}
