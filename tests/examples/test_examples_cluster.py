"""examples/cluster/: the launchers, checked as far as a machine without a cluster can (issue 43).

- rayjob.yaml against the ``openAPIV3Schema`` of KubeRay's RayJob CRD (vendored: kuberay/SOURCE.md)
  with jsonschema, plus the fields the schema does not list (what ``kubectl apply --validate=strict``
  refuses: a misspelt key is pruned silently by the API server otherwise); its worker groups lend
  the slots the config asks for;
- slurm.sbatch with ``bash -n`` and a dry run (DRY_RUN=1: the commands printed, not run);
- submit.sh likewise; the config they all launch loads and passes glassrl's checks.
"""

from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from glassrl.config import load_config
from glassrl.rl.config import TrainConfig
from glassrl.rl.resolve import resolve

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "examples" / "cluster"
CRD = Path(__file__).resolve().parent / "kuberay" / "ray.io_rayjobs.yaml.gz"


@pytest.fixture(scope="module")
def crd() -> dict:
    return yaml.load(gzip.decompress(CRD.read_bytes()), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _schema(crd: dict, version: str) -> dict:
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    return served["schema"]["openAPIV3Schema"]


def unknown_fields(value, schema: dict, where: str = "") -> list[str]:
    """Keys of ``value`` that ``schema`` does not declare, where it declares its properties and
    takes no others (Kubernetes' structural schemas: ``kubectl apply --validate=strict``)."""
    found = []
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        open_ended = schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                found += unknown_fields(item, props[key], f"{where}.{key}")
            elif not open_ended:
                found.append(f"{where}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += unknown_fields(item, schema["items"], f"{where}[{i}]")
    return found


def _problems(manifest: dict, crd: dict) -> list[str]:
    schema = _schema(crd, manifest["apiVersion"].rpartition("/")[2])
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft4Validator(schema).iter_errors(manifest)
    ]
    return errors + [f"{key}: not in the schema" for key in unknown_fields(manifest, schema)]


def test_the_rayjob_manifest_is_valid_against_kuberay_s_crd(crd):
    manifest = yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())
    group, _, version = manifest["apiVersion"].partition("/")
    assert (group, manifest["kind"]) == (crd["spec"]["group"], crd["spec"]["names"]["kind"])
    assert _problems(manifest, crd) == []

    # The check can fail: a wrong type, and a misspelt key the API server would drop.
    broken = json.loads(json.dumps(manifest))
    broken["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "two"
    broken["spec"]["rayClusterSpec"]["workerGroupSpec"] = []
    problems = _problems(broken, crd)
    assert any("replicas" in p and "'two' is not of type 'integer'" in p for p in problems), problems
    assert ".spec.rayClusterSpec.workerGroupSpec: not in the schema" in problems


def test_the_rayjob_runs_the_cluster_config_on_nodes_that_lend_its_slots():
    manifest = yaml.safe_load((CLUSTER / "rayjob.yaml").read_text())
    command = shlex.split(manifest["spec"]["entrypoint"])
    assert command[:2] == ["glassrl", "train"]
    config = ROOT / Path(command[2]).relative_to("/opt/glassrl")  # the repository in the image
    cfg = resolve(load_config(TrainConfig, config, command[3:])).cfg
    assert cfg.output_dir.startswith("/shared/")
    spec = manifest["spec"]["rayClusterSpec"]
    mounts = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    for template in mounts:  # the run directory on every pod
        volumes = template["spec"]["containers"][0]["volumeMounts"]
        assert any(cfg.output_dir.startswith(v["mountPath"] + "/") for v in volumes)
    lent: dict[str, int] = {}
    for g in spec["workerGroupSpecs"]:
        for slot, count in json.loads(json.loads(g["rayStartParams"]["resources"])).items():
            lent[slot] = lent.get(slot, 0) + count * g["replicas"]
    ray = cfg.ray
    for role in (ray.actor, ray.rollout):
        for slot, amount in role.resources.items():
            if slot not in ("CPU", "GPU"):
                assert lent.get(slot, 0) >= amount * role.world_size, (slot, lent)


def _bash(script: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(CLUSTER / script)], capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1", **env}
    )


@pytest.mark.parametrize("script", ["slurm.sbatch", "submit.sh"])
def test_the_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(CLUSTER / script)], capture_output=True).returncode == 0


def test_the_slurm_script_starts_the_head_then_a_worker_a_node_then_the_driver():
    done = _bash("slurm.sbatch", GLASSRL_NODES="n1 n2 n3 n4", RESUME="1")
    assert done.returncode == 0, done.stderr
    lines = [shlex.split(line) for line in done.stdout.splitlines()]
    head, _, *workers, train = lines
    assert head[:5] == ["srun", "--nodes=1", "--ntasks=1", "-w", "n1"] and head[5:8] == ["ray", "start", "--head"]
    slots = {w[4]: json.loads(next(a for a in w if a.startswith("--resources=")).partition("=")[2]) for w in workers}
    assert slots == {"n2": {"trainer": 1}, "n3": {"trainer": 1}, "n4": {"sampler": 1}}
    assert all("--address=n1:6379" in w and w[-1] == "&" for w in workers)
    assert train[train.index("glassrl") :] == [
        "glassrl",
        "train",
        "examples/cluster/grpo.yaml",
        "output_dir=/shared/runs/grpo-cluster",
        "ray.address=n1:6379",
        "--resume",
    ]
    assert (ROOT / train[train.index("glassrl") + 2]).is_file()

    few = _bash("slurm.sbatch", GLASSRL_NODES="n1 n2")
    assert few.returncode == 2 and few.stdout == ""
    assert few.stderr.strip() == "slurm.sbatch: needs at least 3 nodes (head, trainer, sampler); got 2: n1 n2"


def test_ray_job_submit_line():
    done = _bash("submit.sh", RAY_HEAD="10.0.0.1")
    assert done.returncode == 0, done.stderr
    command = shlex.split(done.stdout)
    assert command[:3] == ["ray", "job", "submit"] and command[command.index("--address") + 1] == "http://10.0.0.1:8265"
    entry = command[command.index("--") + 1 :]
    assert entry[:2] == ["glassrl", "train"] and (ROOT / entry[2]).is_file()
    assert _bash("submit.sh").returncode != 0  # no head named: it says so and runs nothing
