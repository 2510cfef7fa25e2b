#!/usr/bin/env bash
# The Python packages that benchmarks/gpu_session.sh needs and a GPU machine's image lacks (it has
# torch, transformers, accelerate, pyarrow, pandas, pytest; it reaches no package registry), as
# wheels in .whl/ (git ignores it) to carry there. Run here, where pip reaches PyPI, in the
# repository root; then hand `.whl` to the device call's `carry` (about 12 MB).
# Versions: requirements-lock.txt's, and TRL 1.16.0 (bench_vs_trl.py's TRL_VERSION).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do
  platforms+=(--platform "$p")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl \
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 plotly==7.1.0 \
  math-verify==0.9.0 latex2sympy2-extended==1.11.0 antlr4-python3-runtime==4.13.2
ls -1 .whl && du -sh .whl
