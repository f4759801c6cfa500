# The two commands of the README. Both create/refresh .venv from pyproject.toml first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# Re-install whenever pyproject.toml changes.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: demo test lint bench

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(STAMP)
	$(PY) examples/run_notebook.py examples/quickstart.ipynb

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m elasticdl_nb.runtime.protocol.generate --check

# The browser tests drive Debian's chromium (Playwright cannot download its own here).
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium

test: $(STAMP) $(CHROMIUM) lint
	$(PY) -m pytest -q -p no:cacheprovider; code=$$?; \
	  if [ $$code -eq 5 ]; then echo "no tests ran: that is a failure"; exit 1; fi; exit $$code

BENCH_STAMP := $(VENV)/.bench-$(shell sha1sum pyproject.toml | cut -c1-12)

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m pip install --quiet --no-deps tf_keras==2.21.0  # see pyproject's bench extra
	rm -f $(VENV)/.bench-*
	touch $@

bench: $(BENCH_STAMP)
	$(PY) bench/run.py
