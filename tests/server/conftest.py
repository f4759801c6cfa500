"""A real Jupyter server in the test process (pytest-jupyter), with the elasticdl-nb
server extension loaded as `pip install` enables it.

pytest-jupyter's fixtures and hooks are imported here rather than named in
`pytest_plugins`, which pytest accepts only in the top-level conftest (a whole-suite run
fails to collect) and which would give every test of the suite its autouse event-loop
fixtures: this way they are for the tests of this directory only.
"""

from __future__ import annotations

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403  (fixtures and hooks)


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"elasticdl_nb.server": True}}}
