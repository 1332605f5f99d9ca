# blockmem_lite — the two commands a newcomer needs:
#   make lab    set up .venv if needed, check the environment, open JupyterLab on notebooks/
#   make test   set up .venv if needed, lint, check exercises, run pytest + every notebook (fast mode)
#
# Options for JupyterLab go through LAB_ARGS, e.g.  make lab LAB_ARGS="--no-browser --ip=0.0.0.0"
#
# TORCH_SPEC picks the PyTorch build. The default pins the version the kit is
# tested with; pip then takes your platform's wheel (on this project's CI machine
# that is a CPU wheel on local disk). For a CPU-only build on Linux pass PyTorch's
# CPU wheel index, e.g.  make lab TORCH_PIP_ARGS="--index-url <PyTorch CPU index URL>"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.blockmem_installed
PORT ?= 8888
LAB_ARGS ?=
# Jupyter refuses to run as root unless told; containers often run as root.
LAB_ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)

# OpenMP threads that wait passively: with several torch processes on few cores
# (two kernels, or a kernel and a benchmark) spinning threads slow every process
# down by orders of magnitude; a lone process loses nothing measurable.
export OMP_WAIT_POLICY ?= PASSIVE

# Environment for headless, offline, fast runs (CI and `make test`).
TEST_ENV := BLOCKMEM_FAST=1 BLOCKMEM_HEADLESS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
	PLOTLY_RENDERER=json PYTHONHASHSEED=0

PRESET ?= fast
SITE ?= site

.PHONY: setup hygiene lab test test-browser lint exercises bench site clean-notebooks help

help:
	@echo "make lab    - set up (if needed) and open JupyterLab on notebooks/ (stop: Ctrl-C twice);"
	@echo "              options for Jupyter: make lab LAB_ARGS=\"--no-browser --ip=0.0.0.0\""
	@echo "make test   - set up (if needed) and run every test (library + notebooks, fast mode)"
	@echo "make test-browser - only the notebooks in JupyterLab under headless Chromium (make test runs"
	@echo "              it too whenever Chromium is installed)"
	@echo "make bench  - run the dense benchmark and print the table"
	@echo "make site   - static HTML pages of every notebook with outputs into site/ (fast mode);"
	@echo "              make site PRESET=class for the class-mode site a teacher publishes"
	@echo "make exercises - regenerate notebooks/exercises/ from notebooks/solutions/"
	@echo "make clean-notebooks - clear outputs of every notebook before committing"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[notebooks,test]"
	@touch $(STAMP)

setup: $(STAMP) hygiene

# Notebook hygiene, re-applied on every setup (cheap, idempotent):
# - git stores notebooks through nbstripout (outputs, counts and widget state stripped;
#   cell ids kept, they are the exercises' grade ids); the working copy keeps its outputs;
# - JupyterLab saves widget state into the notebook (jupyter/overrides.json), so a
#   reopened notebook shows its last figures instead of "model not found".
hygiene: $(STAMP)
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
		git config filter.nbstripout.clean '"$(abspath $(BIN))/python" -m nbstripout --keep-id'; \
		git config filter.nbstripout.smudge cat; \
		git config diff.ipynb.textconv '"$(abspath $(BIN))/python" -m nbstripout --keep-id -t'; \
	fi
	@mkdir -p $(VENV)/share/jupyter/lab/settings
	@cp jupyter/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json

lab: setup
	$(BIN)/python -m blockmem_lite envcheck
	$(BIN)/jupyter lab --notebook-dir=notebooks --port=$(PORT) $(LAB_ROOT_FLAG) $(LAB_ARGS)

lint: setup
	$(BIN)/python -m ruff check blockmem_lite tests notebooks

exercises: setup
	$(BIN)/python -m blockmem_lite exercises build

test: setup lint
	$(BIN)/python -m blockmem_lite exercises check
	$(TEST_ENV) $(BIN)/python -m pytest tests \
		--nbval-lax --nbval-current-env --nbval-cell-timeout=600 \
		notebooks/*.ipynb notebooks/solutions/*.ipynb

test-browser: setup
	$(BIN)/python -m pytest tests/test_browser.py -m browser -ra

bench: setup
	$(BIN)/python -m blockmem_lite bench --arch dense --seq-len 256,1024,4096

clean-notebooks: setup
	$(BIN)/python -m blockmem_lite exercises strip notebooks

site: setup
	$(BIN)/python -m blockmem_lite site --preset $(PRESET) --out $(SITE)
