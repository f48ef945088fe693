# swerl — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
export SWERL_CACHE_DIR ?= $(HOME)/.cache/swerl
export DOCKER_HOST ?= unix:///run/swerl/docker.sock
export LITELLM_LOCAL_MODEL_COST_MAP := True
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help setup demo test test-fast test-learning test-all lint format bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

setup:  ## install and build everything that is missing (idempotent, cached)
	@deploy/dev/setup.sh all

# The main job: Li2SAO trains the toy task through the whole stack, submitted as a train job
# through the job API with the swerl CLI and followed with `swerl status --watch` (a progress
# line per step), the run's dashboard and summary, then one SWE rollout batch of the mini
# instances with the trained policy beside the scripted engine (README "What make demo does").
DEMO_STAMP := $(shell date +%Y%m%d-%H%M%S)
DEMO_DIR ?= runs/demo-$(DEMO_STAMP)
demo: setup  ## train Li2SAO on the toy task (whole stack), its dashboard, then a SWE rollout batch
	@$(PY) -m services.toy_train_job --config trainer/configs/toy_li2sao.yaml --run-dir $(DEMO_DIR)/toy
	@$(PY) -m trainer report $(DEMO_DIR)/toy
	@$(PY) -m services.demo --model $(DEMO_DIR)/toy/weights --run-dir $(DEMO_DIR)/swe $(DEMO_ARGS)

# The suite's temp dirs live in a private base dir: pytest runs started *by* tests (the mini
# repos' own suites) rotate /tmp/pytest-of-<user> and would delete the outer run's dirs.
# `make test` leaves out the tests marked `learning`: repeat learning runs of several minutes
# each (LiSAO, PACT and SR-PPO on the toy task; PACT and SR-PPO on the SWE path) whose code
# paths the runs it keeps cover (GRPO and Li2SAO learning the toy task, Li2SAO's switch into
# LiSAO's single-rollout phase, LiSAO on the SWE path). Together they are about 15 minutes on
# 2 quiet cores and would push CI past its limit; `make test-learning` runs them,
# `make test-all` runs everything.
test: setup lint  ## set up, lint, and run the test suite (all but the `learning` repeats)
	@base=$$(mktemp -d /tmp/swerl-pytest.XXXXXX) && \
	  $(PY) -m pytest -q -p no:cacheprovider --basetemp=$$base -m "not learning"; rc=$$?; \
	  rm -rf $$base; exit $$rc

test-learning: setup  ## the repeat learning runs make test leaves out (~15 min on 2 cores)
	@base=$$(mktemp -d /tmp/swerl-pytest.XXXXXX) && \
	  $(PY) -m pytest -q -p no:cacheprovider --basetemp=$$base -m learning tests/e2e; rc=$$?; \
	  rm -rf $$base; exit $$rc

test-all: setup lint  ## every test, the learning repeats included
	@base=$$(mktemp -d /tmp/swerl-pytest.XXXXXX) && \
	  $(PY) -m pytest -q -p no:cacheprovider --basetemp=$$base; rc=$$?; rm -rf $$base; exit $$rc

# The fast tier: unit tests not marked slow (no subprocesses, services or long batches) and the
# suite-layout checks at tests/ level; under 2 minutes on a 2-core machine.
test-fast:  ## the fast tier: unit tests without the `slow` ones (make test-all runs everything)
	@base=$$(mktemp -d /tmp/swerl-pytest.XXXXXX) && \
	  $(PY) -m pytest -q -p no:cacheprovider --basetemp=$$base -m "not slow" \
	    tests/unit tests/test_*.py; rc=$$?; rm -rf $$base; exit $$rc

lint:  ## ruff lint + format check
	@.venv/bin/ruff check .
	@.venv/bin/ruff format --check .

format:  ## apply ruff fixes and formatting
	@.venv/bin/ruff check --fix .
	@.venv/bin/ruff format .

# Benchmarks whose full size takes hours (several whole training runs) run their --quick form here.
BENCH_QUICK := bench_time_to_reward bench_demo_reliability
bench: setup  ## run every benchmark (prints side-by-side ratios; the long ones --quick)
	@for b in bench/bench_*.py; do n=$$(basename $$b .py); a=""; \
	  case " $(BENCH_QUICK) " in *" $$n "*) a=--quick;; esac; \
	  echo "== $$b $$a"; $(PY) $$b $$a || exit 1; done

clean:  ## stop the private dockerd and remove build outputs (caches stay)
	@deploy/dev/dockerd.sh stop || true
	@rm -rf .pytest_cache .ruff_cache build
