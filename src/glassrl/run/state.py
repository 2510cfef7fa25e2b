"""The complete state of a run, as named checkpoint parts, and its restoration.

A resumed run must end bit-identical (on CPU) to one that never stopped, so the
checkpoint holds everything that influences what comes next:

    actor, actor_optim          policy weights (HF directory) / AdamW + schedule
    critic, critic_optim        the same for the critic (when the estimator uses one)
    rollout_rng                 the sampling generator (glassrl.rollout.hf)
    rng                         python random, numpy, torch CPU (and CUDA) global
                                states, and the trainer's mini-batch shuffle generator
    data                        position in the prompt stream (epoch, index)
    ptx_data                    position in the PPO-ptx pairs (when algo.ptx_coef > 0)
    kl_controller               β of the KL controller
    counters                    completed training steps
    threads                     the intra-op thread count the steps ran with (:class:`Threads`)
    config                      the resolved config of the run (:class:`RunConfig`)
    plus every part of the optional components the config turns on (reward
    normaliser, sample buffer), each under its own name.

:func:`restore` asks the checkpoint for exactly the parts this config saves, so a
missing one is an error naming it (glassrl.run.checkpoint), never a default.
RNG states are restored last: loading weights may draw from torch's RNG. Every part but
the models is plain data encoded by glassrl.run.codec (JSON + safetensors), so what is
saved is what is read back, whatever the data held (a Parquet timestamp, a set, a NaN).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from transformers.utils import logging as hf_logging

from glassrl.config import flatten
from glassrl.errors import GlassrlError
from glassrl.run.checkpoint import CheckpointManager, Part, read_manifest
from glassrl.run.validate import conform


@runtime_checkable
class Stateful(Protocol):
    """What a checkpoint holds: named parts (``part_names``), ``(kind, value)`` pairs from
    :meth:`state_dict` as glassrl.run.checkpoint.Part reads them, loaded back by name (a Path for "hf"
    parts). Every role worker that holds state is one (glassrl.workers.base), and so is every other
    part of a run (the prompt stream, the counters, the RNGs)."""

    part_names: tuple[str, ...]

    def state_dict(self) -> dict[str, tuple[str, Any]]: ...

    def load_state_dict(self, parts: dict[str, Any]) -> None: ...


class GlobalRNG:
    """Python, numpy and torch global RNGs plus the trainer's own generators, as one part."""

    part_names = ("rng",)

    def __init__(self, generators: dict[str, torch.Generator]) -> None:
        self.generators = generators

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        state = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "generators": {name: g.get_state() for name, g in self.generators.items()},
        }
        return {"rng": ("torch", state)}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        state = parts["rng"]
        random.setstate(_as_python_state(state["python"]))
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if state["cuda"]:
            torch.cuda.set_rng_state_all(state["cuda"])
        for name, g in self.generators.items():
            g.set_state(state["generators"][name])


def _as_python_state(state) -> tuple:
    """random.setstate wants (version, tuple of ints, gauss) — a loaded state may hold lists."""
    version, internal, gauss = state
    return version, tuple(internal), gauss


class Counters:
    """Completed training steps."""

    part_names = ("counters",)

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        return {"counters": ("json", {"step": self.step})}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        self.step = int(parts["counters"]["step"])


class Threads:
    """The run's intra-op thread count (glassrl.models.threads) as part "threads".

    More threads may split a reduction differently and change its rounding, so a resumed run
    under ``threads: auto`` computes with the count its checkpoint recorded, not the one the
    load would choose now. It needs the count before it builds anything, so the Trainer reads it
    first (:func:`recorded_threads`); loading the part with the others adds nothing.
    ``required=False``: resuming from a checkpoint written before glassrl recorded the count.
    """

    def __init__(self, count: int, why: str, *, required: bool = True) -> None:
        self.count, self.why = count, why
        self.part_names = ("threads",) if required else ()

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        return {"threads": ("json", {"count": self.count})}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        pass  # read before the workers were built (recorded_threads)


class Recorded(NamedTuple):
    checkpoint: Path | None  # the checkpoint a resume continues from; None when there is none
    threads: int | None  # the thread count it recorded; None when it recorded none


def recorded_threads(manager: CheckpointManager) -> Recorded:
    """The thread count recorded in the checkpoint :func:`restore` will load (part "threads")."""
    path, _ = manager.find_latest()
    part = manager.load_part(path, "threads") if path is not None else None
    if part is None:
        return Recorded(path, None)
    conform(part, {"count": 1}, str(path / "threads.json"))
    if part["count"] < 1:
        raise GlassrlError(f"{path / 'threads.json'}: count = {part['count']}: a thread count is at least 1")
    return Recorded(path, part["count"])


class RunConfig:
    """The resolved config (plain nested dict) as part "config" of every checkpoint.

    A resumed run is compared with the checkpoint's own copy, not with ``config.yaml``
    beside it (which may be missing or edited by hand). Keys matching ``may_change``
    (dotted prefixes: "steps", "logging.") may differ: ``changes`` then lists them as
    {key: (then, now)}; any other difference is a GlassrlError naming the keys. A key the
    checkpoint does not have (added by a later glassrl) counts as unchanged while it holds
    its default (``defaults``: the config class's defaults, nested).
    """

    part_names = ("config",)

    def __init__(
        self,
        config: dict[str, Any],
        may_change: tuple[str, ...],
        defaults: dict[str, Any],
        upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.config, self.may_change, self.defaults = config, may_change, flatten(defaults)
        self.upgrade = upgrade  # the checkpoint's flat config in today's terms (a value whose meaning changed)
        self.saved: dict[str, Any] = {}  # the checkpoint's copy, once loaded
        self.changes: dict[str, tuple[Any, Any]] = {}

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        return {"config": ("json", self.config)}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        self.saved = parts["config"]
        old, new = flatten(self.saved), flatten(self.config)
        if self.upgrade is not None:
            old = self.upgrade(old)
        missing = object()
        changed = {
            k: (old.get(k), new.get(k))
            for k in sorted(old.keys() | new.keys())
            if old.get(k, missing) != new.get(k, missing)
            and not (k not in old and new[k] == self.defaults.get(k, missing))
        }
        fixed = [k for k in changed if not any(k == p or k.startswith(p + ".") for p in self.may_change)]
        if fixed:
            then, now = changed[fixed[0]]
            raise GlassrlError(
                f"--resume: the config differs from the checkpoint's in {', '.join(fixed)} "
                f"({fixed[0]}: {then!r} then, {now!r} now); a resumed run continues the same run "
                f"(only {', '.join(self.may_change)} may change)"
            )
        self.changes = changed


class Wrapped:
    """An object with plain ``state_dict()`` / ``load_state_dict(dict)`` (KL controller,
    reward normaliser) as one checkpoint part of ``kind``."""

    def __init__(self, name: str, kind: str, obj: Any) -> None:
        self.name, self.kind, self.obj = name, kind, obj
        self.part_names = (name,)

    def state_dict(self) -> dict[str, tuple[str, Any]]:
        return {self.name: (self.kind, self.obj.state_dict())}

    def load_state_dict(self, parts: dict[str, Any]) -> None:
        self.obj.load_state_dict(parts[self.name])


def save(manager: CheckpointManager, step: int, components: list[Stateful]):
    """Write every component's parts as checkpoint ``step``; returns its directory."""
    parts: dict[str, Part] = {}
    for component in components:
        for name, (kind, value) in component.state_dict().items():
            parts[name] = Part(kind, value)
    return manager.save(step, parts)


class Restored(NamedTuple):
    step: int  # completed training steps of the checkpoint
    path: Path  # the checkpoint directory
    note: str | None  # why it is not the one ``latest`` names (CheckpointManager.find_latest), or None


def restore(manager: CheckpointManager, components: list[Stateful]) -> Restored:
    """Load the latest checkpoint into ``components`` in their order (GlobalRNG last).

    GlassrlError when there is no checkpoint, a part is missing, or a restored value is not one this
    run could have saved (:func:`check_restored`); a load that fails all the same (a model's weights
    of another shape) is one line naming the checkpoint and the part, never a traceback.
    """
    path, note = manager.find_latest()
    if path is None:
        raise GlassrlError(f"--resume: no checkpoint in {manager.root}")
    required = {name for component in components for name in component.part_names}
    parts = manager.load(path, required=required)
    check_restored(path, parts, components)
    ordered = sorted(components, key=lambda c: isinstance(c, GlobalRNG))
    for component in ordered:
        names = component.part_names
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # transformers' load report would print lines before the one line
        try:
            component.load_state_dict({name: parts[name] for name in names})
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RuntimeError) as err:
            if isinstance(err, GlassrlError):
                raise
            text = " ".join(str(err).split())[:300]
            if "ignore_mismatched_sizes" in text:  # transformers: a saved weight's shape is not the model's
                text = "the saved weights' shapes are not this model's"
            raise GlassrlError(
                f"--resume: checkpoint {path}: part {', '.join(names)} does not fit this run "
                f"({type(err).__name__}: {text})"
            ) from None
        finally:
            hf_logging.set_verbosity(verbosity)
    return Restored(int(parts["counters"]["step"]), path, note)


def check_restored(path: Path, parts: dict[str, Any], components: list[Stateful]) -> None:
    """Every part of plain state (JSON, or JSON + safetensors) has the shape the component holds now
    and finite numbers (glassrl.run.validate.conform; a component's ``data_parts`` hold data, which may
    be NaN); the step counted equals the checkpoint's (its directory and manifest). GlassrlError
    naming the file and the field. A component may say first, in its own words, why a checkpoint is
    not for it (``check_state(parts)``: a mixture of another number of sources)."""
    manifest = read_manifest(path)
    for component in components:
        names = [n for n in component.part_names if manifest["parts"][n]["kind"] in ("json", "torch")]
        if not names or isinstance(component, RunConfig):  # the config: compared key by key (RunConfig)
            continue
        if hasattr(component, "check_state"):
            component.check_state(parts)
        template = component.state_dict()
        data = getattr(component, "data_parts", ())
        for name in names:
            conform(parts[name], template[name][1], str(path / f"{name}.json"), data=name in data)
    step = parts["counters"].get("step")  # a dict: conform checked it
    if step != manifest["step"]:
        raise GlassrlError(
            f"{path / 'counters.json'}: step = {step}, but the checkpoint is step {manifest['step']} "
            "(its directory and manifest); a resumed run continues from the step it saved"
        )
