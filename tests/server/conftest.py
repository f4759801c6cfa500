"""A real Jupyter server in the test process (pytest-jupyter), with the elasticdl-nb
server extension loaded as `pip install` enables it."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytest_jupyter.jupyter_server"]


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"elasticdl_nb.server": True}}}
