"""Backends are found by name in one registry, and nothing else branches on the name."""

import re
from pathlib import Path

import pytest

import elasticdl_nb
from elasticdl_nb.backends import Backend, backend_names, get_backend
from elasticdl_nb.spec import SpecError

PACKAGE = Path(elasticdl_nb.__file__).parent


@pytest.mark.parametrize("name", backend_names())
def test_each_backend_is_found_by_its_name(name):
    backend = get_backend(name)
    assert isinstance(backend, Backend) and backend.name == name
    assert get_backend(name) is backend  # one per process


def test_an_unknown_backend_is_refused_with_the_ones_there_are():
    with pytest.raises(SpecError, match="'local', 'kubernetes'"):
        get_backend("slurm")


def test_no_code_outside_the_registry_branches_on_a_backend_name():
    names = "|".join(map(re.escape, backend_names()))
    branch = re.compile(rf"""(==|!=|\bin)\s*\(?["']({names})["']|["']({names})["']\s*(==|!=)""")
    found = [
        f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "backend" in line and branch.search(line)
    ]
    assert found == [], "ask the backend (elasticdl_nb.backends.get_backend) instead"
