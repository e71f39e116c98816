# Set-up and entry points. Every target is idempotent and works on a fresh
# Debian/Ubuntu machine with Python 3.11 and root or sudo.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DEMO   ?= out/demo

.PHONY: setup demo test test-slow test-lerobot lint bench bench-convert lerobot-venv clean

$(VENV)/.installed: pyproject.toml constraints.txt
	@command -v ffmpeg >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ffmpeg; }
	@$(PY) -m pip --version >/dev/null 2>&1 || { \
	  [ ! -e $(VENV) ] || [ -f $(VENV)/pyvenv.cfg ] || { echo "$(VENV) exists and is no virtual environment: move it away or pass VENV=DIR"; exit 1; }; \
	  rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); } || { echo "$(PYTHON) -m venv failed: install $(PYTHON) and its venv module (Debian/Ubuntu: apt-get install $(notdir $(PYTHON))-venv), or pass PYTHON=python3.12"; exit 1; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	@touch $@

setup: $(VENV)/.installed

## The main job on the built-in default dataset.
demo: setup
	$(VENV)/bin/lerobot-shards demo --out $(DEMO)

## Lint (ruff, mypy) and the test suite, less the tests marked `slow` (multi-process and fault-injection
## runs of 10 s to a minute each: `make test-slow`, which CI runs too).
test: setup lint
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

## The tests marked `slow`: gloo ranks, killed parents, paused servers, the benchmark harness end to end.
test-slow: setup
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

## The suite against real LeRobot 0.6.1 (tests/lerobot) inside its Python 3.13 environment, built first
## when missing (tests/lerobot/env.sh: a Debian 13 root, ~10 min once, as root). Not part of `make test`.
## tests/test_frame_planes.py runs there too: the frame cache's YUV entries under the lowest torchcodec
## (0.11) and PyAV (15.1, LeRobot's pin) this package allows.
test-lerobot:
	bash tests/lerobot/env.sh setup
	LEROBOT_SHARDS_LEROBOT_SUITE=1 PYTHONPATH=$(CURDIR)/src bash tests/lerobot/env.sh run $(CURDIR) -- -m pytest -q -p no:cacheprovider --timeout=600 tests/lerobot tests/test_frame_planes.py $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples
	$(VENV)/bin/mypy src

## The loader benchmark's quick matrix (benchmarks/README.md): JSON per case, summary.md, summary.csv and
## charts in benchmarks/results/latest. LeRobot baselines: `make lerobot-venv` (and LEROBOT_LATEST_ROOTFS).
bench: setup
	$(PY) benchmarks/bench.py $(BENCH_ARGS)

## Conversion throughput against a plain copy (benchmarks/convert/results/).
bench-convert: setup
	$(PY) benchmarks/convert/bench_convert.py

## A separate venv with LeRobot 0.4.4 for the loader benchmark's baseline (never a dependency).
lerobot-venv:
	bash benchmarks/loader/setup_lerobot_venv.sh

clean:
	rm -rf out .pytest_cache
