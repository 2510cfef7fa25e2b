# Two commands for a newcomer: `make demo` and `make test`. Both create .venv and
# install what they need on first use; later runs reuse it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pinned so that pip takes the CPU build from local disk instead of a
# multi-GB CUDA build; override on a GPU machine: make test TORCH_SPEC=torch==2.13.0
TORCH_SPEC ?= torch==2.13.0
# The preset `make demo` trains: examples/$(ALGO).yaml, e.g. make demo ALGO=ppo
ALGO   ?= grpo
STAMP  := $(VENV)/.installed

.PHONY: demo test install bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m glassrl.commands.demo --algo $(ALGO)

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_advantages.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
