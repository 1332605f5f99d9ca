# blockmem_lite — the two commands a newcomer needs:
#   make lab    set up .venv if needed (the student install), check it, open JupyterLab on notebooks/
#   make test   set up .venv if needed (the maintainer install), lint, check exercises, run pytest +
#               every notebook (fast mode)
#
# Options for JupyterLab go through LAB_ARGS, e.g.  make lab LAB_ARGS="--no-browser --ip=0.0.0.0"
#
# Two installs, both from requirements.lock (made by uv, `make lock`): `make lab` installs the
# kit with its `notebooks` extra, what the notebooks import and nothing more; `make setup` (and
# every maintainer target) installs `dev`: that plus `datasets` (WikiText), transformers (the
# Hugging Face adapter) and the test toolchain (pytest, pytest-xdist, nbval, ruff, playwright,
# kaleido). A .venv that already holds the maintainer install is used as it is by `make lab`.
#
# PyTorch comes first: TORCH_SPEC (TORCH_VERSION, the tested one), from the source TORCH_BUILD
# names, which blockmem_lite/tools/platforms.py chooses: `cpu` on Linux without an NVIDIA GPU
# (PyTorch's own CPU wheel index: PyPI's Linux torch is the CUDA build, several GB), `cuda` on
# Linux with one (PyPI), `default` on macOS and Windows (PyPI). Override either:
#   make lab TORCH_BUILD=cuda        or        make lab TORCH_PIP_ARGS="--index-url URL"
PYTHON ?= python3
VENV ?= .venv
PLATFORMS := blockmem_lite/tools/platforms.py
TORCH_VERSION := 2.13.0
TORCH_SPEC ?= torch==$(TORCH_VERSION)
TORCH_BUILD ?= $(shell $(PYTHON) $(PLATFORMS) torch-build 2>/dev/null)
TORCH_PIP_ARGS ?= $(shell $(PYTHON) $(PLATFORMS) torch-pip-args $(TORCH_BUILD))
LOCK := requirements.lock
BIN := $(VENV)/bin
STAMP := $(VENV)/.blockmem_installed
STUDENT_STAMP := $(VENV)/.blockmem_student
# `make lab` installs the student set, or keeps the maintainer set where .venv has it
LAB_STAMP := $(if $(wildcard $(STAMP)),$(STAMP),$(STUDENT_STAMP))
# The lock as pip constraints, less PyTorch's own build (torch, triton, the CUDA
# libraries): TORCH_SPEC chooses those, and another build's CUDA pins would clash.
CONSTRAINTS := $(VENV)/constraints.txt
TORCH_BUILD_PACKAGES := ^(torch|triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)==
# uv makes the lock (`make lock`); LOCK_ARGS=--upgrade takes the newest allowed versions
# (`make lock LOCK_ARGS="--upgrade-package transformers"` moves one package only).
UV_SPEC ?= uv==0.13.9
LOCK_ARGS ?= --upgrade
# The declared minimums (pyproject.toml's lower bounds; a test keeps them equal), run by
# `make test-oldest`. pip takes PyPI's build of that torch (a CUDA one on Linux: ~3 GB).
MIN_TORCH := 2.4.1
MIN_TRANSFORMERS := 4.48.0
OLDEST_VENV ?= .venv-oldest
LATEST_VENV ?= .venv-latest
PORT ?= 8888
LAB_ARGS ?=
# Jupyter refuses to run as root unless told; containers often run as root.
LAB_ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)
# The kit uses no language server: without the search, JupyterLab does not print the 19 it
# did not find right under its URL.
LAB_QUIET := --LanguageServerManager.autodetect=False

# OpenMP threads that wait passively: with several torch processes on few cores
# (two kernels, or a kernel and a benchmark) spinning threads slow every process
# down by 6 to 50 times. A lone process pays for it: a class-sized training step
# takes 1.2-1.4x as long, a recall-sized one 1.7x (docs/MEASUREMENTS.md, "Class time").
export OMP_WAIT_POLICY ?= PASSIVE

# Environment for headless, offline, fast runs (CI and `make test`); a notebook result
# outside its stored range fails (blockmem_lite/expected.py).
TEST_ENV := BLOCKMEM_FAST=1 BLOCKMEM_HEADLESS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
	PLOTLY_RENDERER=json PYTHONHASHSEED=0 BLOCKMEM_EXPECT_STRICT=1

PRESET ?= fast
SITE ?= site

.PHONY: setup setup-lab lab dist test test-browser test-latest test-oldest lock lint exercises bench \
	site clean-notebooks help

help:
	@echo "make lab    - the student install (if needed), then JupyterLab on notebooks/ (stop: Ctrl-C twice);"
	@echo "              options for Jupyter: make lab LAB_ARGS=\"--no-browser --ip=0.0.0.0\""
	@echo "make test   - the maintainer install (if needed), then every test (library + notebooks, fast mode)"
	@echo "make test-browser - only the notebooks in JupyterLab under headless Chromium (make test runs"
	@echo "              it too whenever Chromium is installed)"
	@echo "make test-latest - the same suite in $(LATEST_VENV) with the newest versions pyproject.toml"
	@echo "              allows (not the lock), to see whether the lock can move (make lock)"
	@echo "make test-oldest - the library tests in $(OLDEST_VENV) with torch $(MIN_TORCH) and"
	@echo "              transformers $(MIN_TRANSFORMERS), the declared minimums"
	@echo "make lock   - remake requirements.lock with uv (the newest versions allowed)"
	@echo "make bench  - run the dense benchmark and print the table"
	@echo "make dist   - the wheel and sdist in dist/ (the wheel carries the notebooks)"
	@echo "make site   - static HTML pages of every notebook with outputs into site/ (fast mode);"
	@echo "              make site PRESET=class for the class-mode site a teacher publishes"
	@echo "make exercises - regenerate notebooks/exercises/ from notebooks/solutions/"
	@echo "make clean-notebooks - clear outputs of every notebook before committing"

# The kit with the extras $(1), into $(VENV): the Python checked first (the kit's own message
# for one too old or an Intel Mac), PyTorch alone from its source, then the rest through the lock.
# -qq on the last step: setuptools' ten-line notice on every editable install is not for a
# student; pip's errors still show.
define install_kit
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "blockmem_lite needs Python 3.10 or newer, \
		and there is no '$(PYTHON)' here: install one and name it, e.g. make lab PYTHON=python3.12"; \
		exit 1; }
	@$(PYTHON) $(PLATFORMS) check
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@echo "PyTorch: the $(TORCH_BUILD) build (TORCH_BUILD=cpu|cuda|default chooses another)"
	$(BIN)/python -m pip install --quiet --no-deps $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	@grep -vE '$(TORCH_BUILD_PACKAGES)' $(LOCK) > $(CONSTRAINTS)
	@echo "The kit with [$(1)] and the versions of $(LOCK) (a minute or two the first time)"
	$(BIN)/python -m pip install -qq -c $(CONSTRAINTS) -e ".[$(1)]"
endef

# Notebook hygiene, re-applied on every setup (cheap, idempotent):
# - git stores notebooks through nbstripout (outputs, counts, widget state and
#   language_info, the Python version JupyterLab writes on every save, stripped; cell ids
#   kept, they are the exercises' grade ids); the working copy keeps its outputs;
# - JupyterLab saves widget state into the working copy (jupyter/overrides.json), so a
#   reopened notebook shows its sliders as they were; the live charts end as plain
#   figures and need none.
define hygiene
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
		git config filter.nbstripout.clean \
			'"$(abspath $(BIN))/python" -m nbstripout --keep-id --extra-keys metadata.language_info'; \
		git config filter.nbstripout.smudge cat; \
		git config diff.ipynb.textconv \
			'"$(abspath $(BIN))/python" -m nbstripout --keep-id --extra-keys metadata.language_info -t'; \
	fi
	@mkdir -p $(VENV)/share/jupyter/lab/settings
	@cp jupyter/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
endef

$(STAMP): pyproject.toml $(LOCK)
	$(call install_kit,dev)
	@touch $(STAMP)

$(STUDENT_STAMP): pyproject.toml $(LOCK)
	$(call install_kit,notebooks)
	@touch $(STUDENT_STAMP)

setup: $(STAMP)
	$(hygiene)

setup-lab: $(LAB_STAMP)
	$(hygiene)

lab: setup-lab
	$(BIN)/python -m blockmem_lite envcheck
	$(BIN)/jupyter lab --notebook-dir=notebooks --port=$(PORT) $(LAB_ROOT_FLAG) $(LAB_QUIET) $(LAB_ARGS)

# The suite, with the python of $(1): lint, exercises, pytest + every notebook, on
# TEST_WORKERS pytest-xdist workers (each test module and each notebook stays on one worker,
# its cells in order: --dist loadscope; TEST_WORKERS=0 runs in one process). The tests run
# torch on one thread and wait on kernels and subprocesses, so two workers fill 2 cores.
# The solution notebooks are not run a second time by nbval:
# tests/test_mutants.py already runs every cell of each one in a kernel, with the answers in
# place up to each check and the cells after the last, and the whole suite must stay under
# 20 minutes on 2 cores.
TEST_WORKERS ?= 2
define run_suite
	$(1)/python -m ruff check blockmem_lite tests notebooks
	$(1)/python -m blockmem_lite exercises check
	$(TEST_ENV) $(1)/python -m pytest tests --durations=25 -n $(TEST_WORKERS) --dist loadscope \
		--nbval-lax --nbval-current-env --nbval-cell-timeout=600 notebooks/*.ipynb
endef

lint: setup
	$(BIN)/python -m ruff check blockmem_lite tests notebooks

exercises: setup
	$(BIN)/python -m blockmem_lite exercises build

test: setup
	$(call run_suite,$(BIN))

# A fresh venv with the newest versions pyproject.toml allows, torch included (the eager
# upgrade moves it past TORCH_SPEC to the newest pip may take: on Linux from PyPI a CUDA
# build of several GB), then the whole suite. envcheck first names every package that
# moved from the lock.
test-latest:
	$(PYTHON) -m venv --clear $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST_VENV)/bin/python -m pip install --quiet $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(LATEST_VENV)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager \
		-e ".[dev]"
	-$(LATEST_VENV)/bin/python -m blockmem_lite envcheck
	$(call run_suite,$(LATEST_VENV)/bin)

# A fresh venv with torch and transformers at the declared minimums (the rest resolved
# for them), then the library tests: the notebooks and the browser are the lock's job.
test-oldest:
	$(PYTHON) -m venv --clear $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip install --quiet "torch==$(MIN_TORCH)"
	$(OLDEST_VENV)/bin/python -m pip install --quiet -e ".[dev]" \
		"torch==$(MIN_TORCH)" "transformers==$(MIN_TRANSFORMERS)"
	-$(OLDEST_VENV)/bin/python -m blockmem_lite envcheck
	$(TEST_ENV) $(OLDEST_VENV)/bin/python -m pytest tests --ignore=tests/test_browser.py

lock: $(STAMP)
	$(BIN)/python -m pip install --quiet "$(UV_SPEC)"
	@echo "torch==$(TORCH_VERSION)" > $(VENV)/torch-pin.txt
	$(BIN)/uv pip compile pyproject.toml --universal --fork-strategy fewest \
		--extra notebooks --extra data --extra hf --extra test -c $(VENV)/torch-pin.txt $(LOCK_ARGS) \
		--custom-compile-command "make lock" --quiet -o $(LOCK)
	@echo "$(LOCK) remade; run make test (and commit the lock with what changed it)"

# The wheel and sdist, into dist/. The wheel carries the course (notebooks, exercises, figures,
# the shipped class run; setup.py): `blockmem-lite notebooks DIR` copies them out of an install.
# Built from the working tree as it is, outputs included: `make clean-notebooks` first.
dist: setup
	$(BIN)/python -m build --no-isolation --sdist --wheel --outdir dist .

test-browser: setup
	$(BIN)/python -m pytest tests/test_browser.py -m browser -ra

bench: setup
	$(BIN)/python -m blockmem_lite bench --arch dense --seq-len 256,1024,4096

clean-notebooks: setup
	$(BIN)/python -m blockmem_lite exercises strip notebooks

site: setup
	$(BIN)/python -m blockmem_lite site --preset $(PRESET) --out $(SITE)
