"""Opening a run: a run directory, or one of its checkpoints, by a path a user gives.

    checkpoint = open_checkpoint(Path("runs/grpo"))           # the run's latest checkpoint
    checkpoint.actor, checkpoint.critic                         # the policy's (and critic's) model directories
    checkpoint.part("kl_controller")                            # any part, its files verified, decoded
    checkpoint.config(TrainConfig)                              # the run's config.yaml

What ``glassrl explain --model`` and ``glassrl export`` open (and what a warm start from
``RUN/checkpoints/step_N`` needs: ``open_checkpoint(path).actor``). A path names

- a run directory (``config.yaml`` or ``checkpoints/`` in it): its latest checkpoint, the one
  ``checkpoints/latest`` names, or the newest that verifies when that pointer is broken
  (:meth:`glassrl.run.checkpoint.CheckpointManager.find_latest`);
- its ``checkpoints/latest`` pointer: the same;
- one checkpoint (a directory with ``manifest.json``), ``RUN/checkpoints/step_XXXXXXXX``.

Anything else is not a run: :func:`open_checkpoint` returns None, and the caller tries what
else the path may be (a Hugging Face model directory).

:func:`model_in_run` is the warm start: a config key that names a model (``model.actor``,
``model.reference``, ``model.critic``, a reward model's or a teacher's ``path``, the SFT/RM/DPO
``model``) may name a run or a checkpoint instead, meaning the model directory of its policy
(or critic) there. A directory with a ``config.json`` (and no ``manifest.json``) is a model,
even when it holds ``checkpoints/`` too (the SFT, RM and DPO output directories).

The manifest is read when the checkpoint is opened (its format, its step); each part's
files are checked against it (sizes, sha256) when the part is read, so that a reader pays
for what it reads (export: the policy; explain: policy, critic, KL controller, counters),
never an optimiser's state, and never reads a corrupt file. Errors are one GlassrlError
line naming the path; the caller puts its flag in front.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from glassrl.config import load_saved_config
from glassrl.errors import GlassrlError
from glassrl.run.checkpoint import LATEST, MANIFEST, CheckpointManager, read_manifest

C = TypeVar("C")

ADAPTER_CONFIG = "adapter_config.json"  # a LoRA policy's part holds peft adapters (glassrl.models.lora)
CHECKPOINTS = "checkpoints"  # the run directory's checkpoint root (glassrl.rl.loop)
CONFIG = "config.yaml"  # the run's resolved config (glassrl.rl.loop)
ACTOR, CRITIC = "actor", "critic"  # the policy's and the critic's parts: Hugging Face model directories


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint of a run: ``path`` = ``run/checkpoints/step_XXXXXXXX``."""

    path: Path
    run: Path  # the run directory holding it
    manifest: dict  # glassrl.run.checkpoint.read_manifest: its parts, their files' sizes and sha256

    def part(self, name: str, required: bool = True) -> object:
        """Part ``name``, its files verified and decoded (glassrl.run.checkpoint: an hf part is
        its directory's Path); None when absent and not ``required``."""
        if name not in self.manifest["parts"]:
            if required:
                raise GlassrlError(f"checkpoint {self.path} has no part {name!r}")
            return None
        return CheckpointManager(self.path.parent, keep=1).load_part(self.path, name)

    @property
    def actor(self) -> Path:
        """The policy: a Hugging Face model directory (LoRA adapters, or the whole model)."""
        return self.part(ACTOR)  # type: ignore[return-value]

    @property
    def critic(self) -> Path | None:
        """The critic (model and value head), None when the run has none."""
        return self.part(CRITIC, required=False)  # type: ignore[return-value]

    def config(self, cls: type[C]) -> C:
        """The run's config (``run/config.yaml``, as glassrl wrote it) as a ``cls``."""
        file = self.run / CONFIG
        if not file.is_file():
            raise GlassrlError(f"checkpoint {self.path} is not inside a run directory (no {file})")
        return load_saved_config(cls, file)


def open_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint ``path`` names (see the module docstring); None when it names no run."""
    path = Path(path)
    if path.name == LATEST and path.is_file():  # RUN/checkpoints/latest
        path = path.parent.parent
    if (path / CONFIG).is_file() or (path / CHECKPOINTS).is_dir():
        latest = CheckpointManager(path / CHECKPOINTS, keep=1).latest()
        if latest is None:
            raise GlassrlError(f"run directory {path} has no checkpoint yet (no {path / CHECKPOINTS / LATEST})")
        path = latest
    elif not (path / MANIFEST).is_file():
        return None
    return Checkpoint(path, path.parent.parent, read_manifest(path))


def model_in_run(name: str | Path, key: str, part: str = ACTOR) -> tuple[Path, str] | None:
    """The model directory that ``name`` names when it is a run or one of its checkpoints (the
    part ``part`` there: the policy, or the critic; its files verified), with the start-up line
    that says what was loaded; None when ``name`` is a model directory or names no run.
    ``key`` names the config key in errors. A LoRA policy's adapters are refused, with the way
    to a model (``glassrl export``)."""
    path = Path(name)
    if (path / "config.json").is_file() and not (
        path / MANIFEST
    ).is_file():  # a checkpoint's config part is config.json
        return None
    checkpoint = open_checkpoint(path)
    if checkpoint is None:
        return None
    role = "policy" if part == ACTOR else part
    if part not in checkpoint.manifest["parts"]:
        raise GlassrlError(f"{key} = {str(name)!r}: checkpoint {checkpoint.path} holds no {role} ({part})")
    directory: Path = checkpoint.part(part)  # type: ignore[assignment]
    if (directory / ADAPTER_CONFIG).is_file():
        merge = f"; merge them into one first (glassrl export {name} --out DIR) and name DIR" if part == ACTOR else ""
        raise GlassrlError(
            f"{key} = {str(name)!r}: checkpoint {checkpoint.path} holds LoRA adapters, not a model{merge}"
        )
    step = checkpoint.manifest.get("step")
    return directory.resolve(), f"{key}: {directory} (the {role} at step {step} of the run {checkpoint.run})"


def resumed_run_directory(config_file: str | Path, output_dir: str) -> tuple[Path, str | None]:
    """The run a ``--resume`` continues when its config is ``config_file`` (issue 37, item 8): a run's
    own ``config.yaml`` (``checkpoints/`` beside it) means that run, the directory it lies in, even
    when the ``output_dir`` inside names another (a copied run: its ``output_dir`` still names the
    original, which it must never append to); with the line that says so. Any other config: its
    ``output_dir``."""
    file = Path(config_file)
    if file.name != CONFIG or not (file.parent / CHECKPOINTS).is_dir():
        return Path(output_dir), None
    here = file.parent
    if Path(output_dir).resolve() == here.resolve():
        return Path(output_dir), None
    return here, (
        f"--resume: {file} lies in the run directory {here}, whose output_dir names {output_dir}; "
        f"resuming {here} (give output_dir={output_dir} to resume that one)"
    )
