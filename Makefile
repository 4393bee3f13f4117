# specdec: `make run`, `make install`, `make test`, `make lint`, `make bench`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LLAMA_CPP_VERSION ?= 0.3.36
LLAMA_PATCHES := $(wildcard patches/llama.cpp/*.patch)
NATIVE_SOURCES := $(wildcard native/rowwise/*.c native/rowwise/*.h native/cuda/*.cu native/cuda/*.cuh)
STAMP := $(VENV)/.specdec-installed

# make run's prompt: `make run PROMPT="..."` or `PROMPT="..." make run`.
PROMPT ?= Write a Python function that reverses a linked list.
export PROMPT

.PHONY: run install test test-fast test-native bench-native lint bench rebuild-llama clean

install: $(STAMP)

# llama-cpp-python compiles llama.cpp from source: scripts/build-llama-cpp-python.sh fetches the
# pinned sdist, applies patches/llama.cpp/*.patch (batch-invariant kernels: exact mode) and
# builds with CMake flags from build_flags.py that are safe for this CPU (never AMX), plus
# SPECDEC_CMAKE_ARGS; CMAKE_ARGS replaces the computed flags. setuptools says "Editable
# installation... be careful with folders" as a UserWarning on every editable install:
# noise on a newcomer's first screen, so not shown (PYTHONWARNINGS below).
$(STAMP): pyproject.toml specdec_cli/build_flags.py scripts/build-llama-cpp-python.sh scripts/check_build.py $(LLAMA_PATCHES) $(NATIVE_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	scripts/build-llama-cpp-python.sh $(PY) $(LLAMA_CPP_VERSION)
	PYTHONWARNINGS=ignore::UserWarning $(PY) -m pip install --quiet -e ".[test]"
	$(PY) scripts/check_build.py
	touch $(STAMP)

# The main job on the default pair, installing first whatever is missing. The prompt travels
# in the environment, so quotes in it need no escaping; stdin is not read.
run: install
	$(VENV)/bin/specdec run --draft tiny --target large -- "$$PROMPT" </dev/null

# Rebuild llama.cpp after changing flags (e.g. SPECDEC_CMAKE_ARGS="-DGGML_CUDA=on"), then check
# that it loads and decodes (on the GPU where it has one) and that exact mode is exact there.
rebuild-llama: install
	scripts/build-llama-cpp-python.sh $(PY) $(LLAMA_CPP_VERSION)
	$(PY) scripts/check_build.py

test: install test-native
	$(PY) -m pytest -ra

# The row-wise kernels alone (native/rowwise/test_rowwise.c): built once for each instruction set
# this machine runs, and once without any (where the kernels must decline). The CUDA kernels
# (native/cuda/test_mmv_tc.cu, test_fattn_rows.cu) through their CPU emulation;
# `make -C native/cuda gpu-test` runs them on a GPU.
test-native:
	$(MAKE) -C native/rowwise test
	$(MAKE) -C native/cuda test

bench-native:
	$(MAKE) -C native/rowwise bench

test-fast: install
	$(PY) -m pytest -ra -m "not slow"

lint: install  # ruff (lint and format) and mypy
	$(VENV)/bin/ruff check specdec_cli tests scripts
	$(VENV)/bin/ruff format --check specdec_cli tests scripts
	$(VENV)/bin/mypy

bench: install
	$(VENV)/bin/specdec bench --draft tiny,small --target large --per-category 1 --repeats 1 \
		--drafter oracle,combined --max-tokens 64 --json bench.json --markdown bench.md

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
