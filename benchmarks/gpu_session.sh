#!/usr/bin/env bash
# The GPU checks of issue 30 as ONE command on a lent GPU machine, sized for the 10 minutes one
# command may run (tests at most 200 s, the bench at most 360 s; not yet run on a GPU), everything
# written to $OUT (the device tool's folder that comes back):
#   1. the wheels of benchmarks/gpu_wheels.sh (carried as .whl) into /tmp/site; glassrl from src/;
#   2. the CUDA test group: pytest -m gpu (tests/gpu: CUDA-graph decoding included), -> $OUT/pytest.log;
#   3. benchmarks/bench_gpu.py: glassrl (CUDA-graph decoding; shared-prefix layout off and on)
#      against TRL (generate; continuous batching) on a random Qwen2-0.5B-shaped model, bf16
#      autocast, 128-token responses -> $OUT/bench_gpu.log and $OUT/bench_gpu.json.
# Here, first: bash benchmarks/gpu_wheels.sh. Then the device tool's run, from the repository root:
#   command: bash benchmarks/gpu_session.sh    carry: [".whl"]    timeout_s: 600
# Each part has its own time limit, so a part that hangs leaves the others' results in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
} >"$OUT/setup.log" 2>&1
export PYTHONPATH=$PWD/src:/tmp/site  # glassrl from the checkout's source
python3 - >>"$OUT/setup.log" 2>&1 <<'PY'
import importlib.metadata as m
import torch
print("device:", torch.cuda.get_device_name(), "| torch", torch.__version__)
for name in ("trl", "transformers", "tokenizers", "accelerate", "datasets", "pyarrow", "huggingface-hub"):
    try:
        print(name, m.version(name))
    except m.PackageNotFoundError:
        print(name, "MISSING")
PY
cat "$OUT/setup.log"

# 2. the CUDA test group (13 passed in 80 s on an H100 before the CUDA-graph tests were added)
timeout 200 python3 -m pytest -m gpu -q -rs tests/gpu tests/models/test_models_loading.py \
  tests/workers/test_workers_data_parallel.py tests/workers/test_workers_weight_sync.py \
  2>&1 | tee "$OUT/pytest.log" | tail -25

# 3. the benchmark: generation alone, then four GRPO runs of 6 steps each (the first left out)
timeout 360 python3 benchmarks/bench_gpu.py --trl-python python3 --out /tmp/bench-gpu \
  --json "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.log"
date -u
