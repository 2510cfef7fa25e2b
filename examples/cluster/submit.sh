#!/usr/bin/env bash
# glassrl on a running Ray cluster, from any machine that reaches its head's dashboard port: the
# repository is uploaded as the job's working directory, and the driver runs on the head.
#
#   RAY_HEAD=10.0.0.1 bash examples/cluster/submit.sh            submit
#   DRY_RUN=1 RAY_HEAD=10.0.0.1 bash examples/cluster/submit.sh  print the command, run nothing
#
# The cluster's nodes lend the slots examples/cluster/grpo.yaml asks for ("trainer", "sampler":
# ray start --resources=...), and every node mounts output_dir (docs/scale-out.md, "On a cluster").
set -euo pipefail

submit=(
    ray job submit
    --address "http://${RAY_HEAD:?set RAY_HEAD to the address of the head node}:8265"
    --working-dir .
    --
    glassrl train examples/cluster/grpo.yaml output_dir=/shared/runs/grpo-cluster
)
if [[ -n ${DRY_RUN:-} ]]; then
    printf '%q ' "${submit[@]}" | sed 's/ $//'
    echo
else
    "${submit[@]}"
fi
