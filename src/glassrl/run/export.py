"""Export a policy from a run that may be training: from a verified checkpoint, into a staged directory.

    export_policy(Path("runs/ppo"), Path("exported"), locate=policy_dir, export=export_merged)

``glassrl export`` during training failed 2 times in 150 (issue 33): the trainer pruned the
checkpoint being copied, and the half-copied output blocked a retry ("exists and is not empty").
Now the output is written into a staged sibling (glassrl.run.atomic.StagedDir) that becomes ``out``
only whole; the checkpoint's policy part is verified against its manifest (every file's size and
sha256) when it is located (glassrl.run.open) and again after the export, so that what was
exported is what the checkpoint held; and a checkpoint removed or changed under the export (a run
pruning it) sends the export to the run's new latest checkpoint, up to ``tries`` times.

``locate`` (the command's: source -> the policy directory, verified) and ``export`` (policy,
directory) are passed in: the run directory knows no model (DESIGN §2).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from glassrl.errors import GlassrlError
from glassrl.run.atomic import StagedDir
from glassrl.run.checkpoint import LATEST, MANIFEST, read_manifest, verify
from glassrl.run.open import CHECKPOINTS

TRIES = 3


def export_policy(
    source: Path,
    out: Path,
    *,
    locate: Callable[[Path], Path],
    export: Callable[[Path, Path], object],
    tries: int = TRIES,
) -> Path:
    """Export the policy ``locate(source)`` names into ``out`` (new or empty) with ``export``; returns ``out``."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GlassrlError(f"--out {out}: exists and is not empty")
    for attempt in range(1, tries + 1):
        try:
            policy = locate(source)  # a checkpoint's policy: its files verified as they are read (glassrl.run.open)
        except (GlassrlError, OSError) as err:
            # The run pruned the checkpoint it named between the listing and the verification (issue 37,
            # item 11: 4 exports in 269): locate again, which finds the new latest. A source that is no
            # run, or a run whose checkpoint stays unreadable, is the error it is.
            if attempt == tries or not _is_run(source):
                if isinstance(err, GlassrlError):
                    raise
                raise GlassrlError(f"{source}: {err.strerror or err}: {err.filename}") from None
            continue
        checkpoint = policy.parent if (policy.parent / MANIFEST).is_file() else None
        try:
            with StagedDir(out) as stage:
                export(policy, stage.path)
                if checkpoint is not None:
                    _verify_part(checkpoint, policy.name)  # and unchanged by the end of the export
            return out
        except (GlassrlError, OSError) as err:
            if checkpoint is None or _intact(checkpoint, policy.name):
                raise  # not the checkpoint's doing
            if attempt == tries or source in (checkpoint, policy):  # no newer checkpoint to go to
                raise GlassrlError(
                    f"{source}: checkpoint {checkpoint.name} was removed or changed while it was exported "
                    f"({err}); nothing was written to {out}: export again"
                ) from None
    raise AssertionError("unreachable")


def _verify_part(checkpoint: Path, part: str) -> None:
    """The files of ``part`` have the sizes and sha256s the checkpoint's manifest records (GlassrlError)."""
    manifest = read_manifest(checkpoint)
    if part not in manifest["parts"]:
        raise GlassrlError(f"{checkpoint}: the manifest has no part {part!r}")
    verify(checkpoint, {**manifest, "parts": {part: manifest["parts"][part]}})


def _intact(checkpoint: Path, part: str) -> bool:
    try:
        _verify_part(checkpoint, part)
    except (GlassrlError, OSError):
        return False
    return True


def _is_run(source: Path) -> bool:
    """``source`` names a run directory (or its ``checkpoints/latest``), whose latest checkpoint moves on."""
    return (source / CHECKPOINTS).is_dir() or (source.name == LATEST and source.parent.name == CHECKPOINTS)
