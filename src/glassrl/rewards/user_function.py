"""A reward written by the user as a Python function, run in an isolated worker process.

The function is named by a spec:

- ``"package.module:function"``: imported with the normal import system (the worker gets the
  trainer's ``sys.path``);
- ``"path/to/rewards.py:function"``: that file loaded as a module; a relative path is resolved
  against ``base_dir`` (the directory of the config that names it; the trainer passes it), so a
  config and its rewards travel together and no PYTHONPATH is needed. The file's directory is
  put on the worker's ``sys.path``, as Python does for a script, so it may import its neighbours.

It may be written in glassrl's, TRL's or verl's convention (``style``; see
:mod:`glassrl.rewards.styles`), detected from its signature when ``style`` is ``auto``.

Isolation (:mod:`glassrl.worker_pool`): the module is imported in a worker, never in the
trainer, within ``import_timeout_s``; each call runs within ``timeout_s`` (one response, or the
whole batch for the batched trl style); what the function returns is converted to a plain
score and JSON-able details inside the worker (:mod:`glassrl.rewards.plain`), and only that
crosses back. Workers run under ``memory_limit_mb`` and are replaced after ``recycle_after``
calls. A hung, crashing, exiting or misbehaving function costs ``timeout`` or ``error`` results
naming the spec, not the run; a function that cannot be loaded at all is a GlassrlError when
the source is built.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from glassrl.errors import GlassrlError
from glassrl.rewards import styles
from glassrl.rewards.base import RewardRequest, RewardResult
from glassrl.rewards.plain import plain_result, result_from_plain
from glassrl.user_code import import_file
from glassrl.worker_pool import (
    DEFAULT_MEMORY_LIMIT_MB,
    DEFAULT_RECYCLE_AFTER,
    CallOutcome,
    WorkerPool,
    shared_pool,
)

logger = logging.getLogger(__name__)

Style = Literal["auto", "glassrl", "trl", "verl"]


# ---------------------------------------------------------------- specs (trainer)


def resolve_spec(spec: Any, base_dir: str | Path = ".", what: str = "user function") -> str:
    """``spec`` with a file path made absolute (against ``base_dir``); GlassrlError for a malformed
    spec or a missing file. Nothing is imported here."""
    if not isinstance(spec, str):
        raise GlassrlError(f"{what} {spec!r}: expected a string 'module:function' or 'path/to/file.py:function'")
    where, sep, attribute = spec.rpartition(":")
    if not sep or not where or not attribute:
        raise GlassrlError(f"{what} {spec!r}: expected 'module:function' or 'path/to/file.py:function'")
    if not where.endswith(".py"):
        return spec
    given = Path(where)
    path = (given if given.is_absolute() else Path(base_dir) / given).resolve()
    if not path.is_file():
        if not given.is_absolute():
            raise GlassrlError(
                f"{what} {spec!r}: no file {path} (a relative path is read from {Path(base_dir).resolve()})"
            )
        # an absolute path: typed so, or a command-line path made the working directory's (issue 44:
        # this named the config's directory); shown as the shell would, relative to the working directory
        cwd = Path.cwd().resolve()
        shown = path.relative_to(cwd) if path.is_relative_to(cwd) else path
        where_read = f" (read from the working directory {cwd})" if path.is_relative_to(cwd) else ""
        raise GlassrlError(f"{what} '{shown}:{attribute}': no file {shown}{where_read}")
    return f"{path}:{attribute}"


# ---------------------------------------------------------------- loading (worker)

_extra_paths: list[str] = []  # directories of loaded files, kept on sys.path in the worker


def load_callable(spec: str) -> Callable[..., Any]:
    """The callable a resolved spec names; ImportError/LookupError/TypeError with a clear message."""
    where, _, attribute = spec.rpartition(":")
    for directory in _extra_paths:
        if directory not in sys.path:
            sys.path.insert(0, directory)
    if where.endswith(".py"):
        target: Any = _load_file(where)
    else:
        try:
            target = importlib.import_module(where)
        except Exception as err:  # noqa: BLE001 - any import failure is the user's to fix
            raise ImportError(f"cannot import module {where!r}: {type(err).__name__}: {err}") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise LookupError(f"{where!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{attribute!r} is not callable")
    return target


def _load_file(path: str) -> Any:
    directory = str(Path(path).resolve().parent)
    if directory not in _extra_paths:  # kept on sys.path, which a worker resets to the caller's per call
        _extra_paths.append(directory)
    return import_file(path, "glassrl_user_rewards")  # puts the directory on sys.path


def preload(spec: str) -> None:
    """The setup of every call (``WorkerPool.call(setup=(preload, (spec,)))``): import the module
    within the import time limit, so the call's own time limit is the function's alone."""
    load_callable(spec)


def _describe(spec: str) -> styles.Parameters | None:
    return styles.describe(load_callable(spec))


def _score_one(spec: str, style: str, names: list[str] | None, item: dict[str, Any]) -> dict[str, Any]:
    value = styles.call_one(load_callable(spec), style, names, item)  # raises: this response's error
    return plain_result(value, len(item["response"]))


def _score_batch(spec: str, names: list[str] | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    values = styles.call_batch(load_callable(spec), names, items)  # raises: the whole batch's error
    return [plain_result(v, len(item["response"])) for v, item in zip(values, items)]


# ---------------------------------------------------------------- the source (trainer)


def load_in_worker(pool: WorkerPool, target: str, where: str, import_timeout_s: float) -> styles.Parameters | None:
    """Load the callable once in a worker of ``pool`` and return its signature, so that a bad
    spec, or an import that hangs, raises or exits, is one GlassrlError at start-up (naming
    ``where``), never a hang or an exit of the trainer."""
    outcome = pool.call(_describe, (target,), import_timeout_s)
    if outcome.status == "timeout":
        raise GlassrlError(
            f"{where}: importing it did not finish within import_timeout_s={import_timeout_s:g} s "
            "(the worker was killed)"
        )
    if outcome.status == "error":
        hint = ""
        if "memory" in outcome.message.lower() and pool.memory_limit_mb is not None:
            hint = f" (each worker may use {pool.memory_limit_mb} MiB of address space: raise memory_limit_mb)"
        raise GlassrlError(f"{where}: {outcome.message}{hint}")
    return None if outcome.value is None else [tuple(p) for p in outcome.value]


class UserFunctionSource:
    """Scores with the user's function (module docstring).

    spec:             ``"module:function"`` or ``"path/to/file.py:function"``
    style:            ``auto`` (from the signature), ``glassrl``, ``trl`` or ``verl``
    timeout_s:        per call: one response, or one batch in the trl style
    import_timeout_s: for importing the module in a worker
    memory_limit_mb:  address-space limit of each worker process; null = none
    recycle_after:    calls a worker serves before it is replaced; null = never
    base_dir:         what a relative file path is read from (the trainer passes the config's directory)
    """

    name = "user_function"

    def __init__(
        self,
        spec: str,
        style: Style = "auto",
        timeout_s: float = 10.0,
        import_timeout_s: float = 60.0,
        memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
        recycle_after: int | None = DEFAULT_RECYCLE_AFTER,
        base_dir: str = ".",
    ) -> None:
        where = f"user_function {spec!r}"
        for key, value in (("timeout_s", timeout_s), ("import_timeout_s", import_timeout_s)):
            if not value > 0:
                raise GlassrlError(f"{where}: {key} must be > 0, got {value!r}")
        for key, value in (("memory_limit_mb", memory_limit_mb), ("recycle_after", recycle_after)):
            if value is not None and value < 1:
                raise GlassrlError(f"{where}: {key} must be >= 1 or null, got {value!r}")
        if style not in ("auto", *styles.STYLES):
            raise GlassrlError(f"{where}: unknown style {style!r}; valid: auto, {', '.join(styles.STYLES)}")
        self.spec = spec
        self.target = resolve_spec(spec, base_dir)
        self.timeout_s = float(timeout_s)
        self.import_timeout_s = float(import_timeout_s)
        self.pool: WorkerPool = shared_pool(memory_limit_mb, recycle_after)
        parameters = load_in_worker(self.pool, self.target, where, self.import_timeout_s)
        self.style = self._pick_style(where, style, parameters)
        self.names = None if parameters is None else styles.accepted(parameters)

    @staticmethod
    def _pick_style(where: str, style: str, parameters: styles.Parameters | None) -> str:
        if parameters is None:
            if style == "auto":
                raise GlassrlError(f"{where}: its signature cannot be read; set style: glassrl, trl or verl")
            return style
        shown = styles.signature_text(parameters)
        if style == "auto":
            detected = styles.detect_style(parameters)
            if detected is None:
                raise GlassrlError(
                    f"{where}: cannot tell its style from {shown}; set style: glassrl "
                    "(prompt, response, answer, metadata), trl (prompts, completions, **kwargs) or verl "
                    "(data_source, solution_str, ground_truth, extra_info)"
                )
            logger.warning("%s: called in the %s style, detected from %s; set style to confirm", where, detected, shown)
            style = detected
        problem = styles.mismatch(style, parameters)
        if problem is not None:
            raise GlassrlError(f"{where}: {problem} (its signature: {shown})")
        return style

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        if not requests:
            return []
        items = [styles.request_item(r) for r in requests]
        setup = (preload, (self.target,))
        if styles.BATCHED[self.style]:
            outcome = self.pool.call(
                _score_batch,
                (self.target, self.names, items),
                self.timeout_s,
                setup=setup,
                setup_timeout_s=self.import_timeout_s,
            )
            if outcome.status != "ok":
                return [self._failure(outcome)] * len(requests)
            if not isinstance(outcome.value, list) or len(outcome.value) != len(requests):
                return [RewardResult.error(f"{self.spec}: malformed result from the reward worker")] * len(requests)
            return [result_from_plain(reply, self.spec) for reply in outcome.value]

        def one(item: dict[str, Any]) -> RewardResult:
            outcome = self.pool.call(
                _score_one,
                (self.target, self.style, self.names, item),
                self.timeout_s,
                setup=setup,
                setup_timeout_s=self.import_timeout_s,
            )
            if outcome.status != "ok":
                return self._failure(outcome)
            return result_from_plain(outcome.value, self.spec)

        with ThreadPoolExecutor(max_workers=self.pool.size) as threads:
            return list(threads.map(one, items))

    def _failure(self, outcome: CallOutcome) -> RewardResult:
        if outcome.status == "timeout":
            return RewardResult.timeout(f"{self.spec}: {outcome.message}")
        return RewardResult.error(f"{self.spec}: {outcome.message}", None, outcome.traceback, outcome.at)
