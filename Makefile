# The README's two commands: `make figures` (set up, run the default sweep, write table and
# figures) and `make test` (set up, run the tests). Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_EXTRA ?=
STAMP := $(VENV)/.workbench-installed
FIGURES_OUT ?= data/results
PYTEST_ARGS ?=

.PHONY: setup test figures lock benchmark browser-test train evaluate clean

setup: $(STAMP)

$(STAMP): requirements/cpu.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --no-deps $(PIP_EXTRA) -r requirements/cpu.txt
	$(PY) -m pip install --no-deps --no-build-isolation -e .
	$(PY) -c "import vllm, nixl, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

test: setup
	$(PY) -m pytest -v --timeout=600 --durations=20 -m "not browser" $(PYTEST_ARGS) tests

figures: setup
	$(PY) -m workbench sweep --grid default --out $(FIGURES_OUT)

benchmark: setup
	$(PY) benchmarks/startup_and_run.py

browser-test: setup
	bash scripts/install-chromium.sh
	$(PY) -m pytest -v --timeout=900 -m browser tests

train: setup
	$(PY) -m workbench.training.train --out data/models

evaluate: setup
	$(PY) -m workbench.training.evaluate --models data/models --prompts 64

# Regenerate the lock from requirements/cpu.in in a scratch venv.
lock:
	rm -rf /tmp/workbench-lock && $(PYTHON) -m venv /tmp/workbench-lock
	/tmp/workbench-lock/bin/pip install --quiet $(PIP_EXTRA) -r requirements/cpu.in
	/tmp/workbench-lock/bin/pip uninstall -y torchvision torchaudio torchcodec
	{ head -3 requirements/cpu.txt; /tmp/workbench-lock/bin/pip freeze --all --exclude-editable | grep -v "^pip=="; } > requirements/cpu.txt.new
	mv requirements/cpu.txt.new requirements/cpu.txt

clean:
	rm -rf $(VENV) .pytest_cache
