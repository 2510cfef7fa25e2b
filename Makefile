# Two commands for a newcomer: `make demo` and `make test`. Both create .venv and
# install what they need on first use; later runs reuse it.
#   make test       lint, format check, import contracts, then the whole test suite
#   make test-fast  the same checks, then every test not marked `slow` (minutes less)
#   make lint       the checks alone; make format rewrites what ruff can fix
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pinned so that pip takes the CPU build from local disk instead of a
# multi-GB CUDA build; override on a GPU machine: make test TORCH_SPEC=torch==2.13.0
TORCH_SPEC ?= torch==2.13.0
# The preset `make demo` trains: examples/$(ALGO).yaml, e.g. make demo ALGO=ppo; or a whole
# pipeline instead: make demo PIPELINE=rlhf (SFT policy → reward model → PPO, examples/rlhf/);
# or an agentic task's demo: make demo TASK=tool-add (calculator calls, examples/tool_add.yaml)
ALGO   ?= grpo
PIPELINE ?=
TASK   ?=
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint format install bench clean

# The [test] extra brings pytest, hypothesis, playwright, ruff and import-linter; ray, lora (peft),
# wandb and mlflow are installed too so that their tests run rather than skip.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test,ray,lora,wandb,mlflow]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/glassrl demo $(if $(PIPELINE),--pipeline $(PIPELINE),$(if $(TASK),--task $(TASK),--algo $(ALGO)))

# ruff's settings and the import contracts (layers, no cycles) are in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff check --fix
	$(BIN)/ruff format

test: lint
	$(BIN)/python -m pytest -q

test-fast: lint
	$(BIN)/python -m pytest -q -m "not slow"

# Quick figures (minutes): GAE, then glassrl against TRL's GRPOTrainer for 4 steps on the default
# model (TRL goes into its own environment, ~/.cache/glassrl/bench-trl-venv, on first use).
# The full runs and their results: BENCHMARKS.md.
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_advantages.py
	$(BIN)/python benchmarks/bench_vs_trl.py --quick

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
