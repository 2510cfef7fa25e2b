"""A user's environment in a worker process of its own per episode: its crash, exit or hang ends the episode.

``rollout.agent.environment: file.py:make`` names the user's code; it runs in a worker of
:mod:`glassrl.worker_pool` (role "environment"), never in the trainer (issue 37: ``os._exit(0)`` in a
``step`` ended ``glassrl train`` with exit code 0; a segfault or an endless loop ended or hung it).

    workers = EnvironmentWorkers("envs/maze.py:make", base_dir, timeout_s=120)   # checks the spec in a worker
    env = workers()              # a WorkerEnvironment: the loop's make_environment
    env.reset(record)            # holds one worker (a Lease) for the episode: makes the environment there
    env.step(text, calls)        # sent there; the StepResult comes back as JSON
    env.close()                  # gives the worker back (the loop does, when the episode ends)

Each episode holds one worker from ``reset`` to ``close``, so one episode's failure touches no
other; the pool grows to the episodes open at once (a rollout's B) and its workers serve the next
episodes (the user's module is imported once per worker; the environment object is made anew at
each ``reset``, as in the trainer). What the worker sends back is plain data, never unpickled.

A ``reset`` or ``step`` that raises (``sys.exit`` included), ends the worker (``os._exit``, a
segfault, the memory limit) or answers nothing within ``timeout_s`` (the worker's process group is
killed) makes the next ``step`` return ``StepResult(done=True, error=...)``: the loop ends the
episode with finish reason "env_error" and the error in its turn (the ledger's ``turns[k].error``,
the metric ``agent/env_error_rate``). An environment that failed at ``reset`` offers no tools.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glassrl.agents.environment import Environment, StepResult
from glassrl.agents.registry import LOAD_TIMEOUT_S, keep_on_path, load_attribute, on_path
from glassrl.agents.tools import ToolCall, ToolFailed
from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.jsonl import as_text
from glassrl.worker_pool import CallOutcome, Lease, WorkerPool

DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class DescribedTool:
    """A tool of an environment in a worker: what the prompt shows of it (its calls run there)."""

    name: str
    description: str
    parameters: dict[str, Any]

    def call(self, arguments: dict[str, Any]) -> str:
        raise ToolFailed("error", f"{self.name} runs in its environment's worker")


class EnvironmentWorkers:
    """Makes :class:`WorkerEnvironment` s of ``spec`` (module docstring); the loop's ``make_environment``.
    ``timeout_s``: the limit of one ``reset`` or ``step``; ``memory_limit_mb``: each worker's address space."""

    def __init__(
        self, spec: str, base_dir: str | Path = ".", *, timeout_s: float = DEFAULT_TIMEOUT_S, memory_limit_mb=None
    ) -> None:
        self.spec, self.base_dir, self.timeout_s = spec, str(Path(base_dir).resolve()), timeout_s
        self.pool = WorkerPool(1, memory_limit_mb=memory_limit_mb, role="environment")
        self._open, self._lock = 0, threading.Lock()
        with self.pool.lease() as lease:  # a bad spec fails now, naming it, from a worker
            outcome = lease.call(_check, (spec, self.base_dir), LOAD_TIMEOUT_S, setup=self.setup())
        if outcome.status != "ok":
            message = outcome.message.removeprefix("setup: ").removeprefix("GlassrlError: ")
            named = message.startswith(f"environment {spec!r}")
            raise GlassrlError(message if named else f"environment {spec!r}: {message}")

    def setup(self) -> tuple:
        return _load, (self.spec, self.base_dir)

    def __call__(self) -> WorkerEnvironment:
        with self._lock:
            self._open += 1
            self.pool.grow(self._open)
        return WorkerEnvironment(self)

    def _closed(self) -> None:
        with self._lock:
            self._open -= 1

    def close(self) -> None:
        """Kill every worker (an episode still running then fails)."""
        self.pool.close()


class WorkerEnvironment:
    """One episode's environment, living in a worker that this object holds from ``reset`` to ``close``."""

    def __init__(self, workers: EnvironmentWorkers) -> None:
        self.workers = workers
        self.tools: tuple[DescribedTool, ...] = ()
        self.lease: Lease | None = None
        self.failure = ""
        self.closed = False

    def reset(self, record: PromptRecord) -> None:
        if self.lease is None:
            self.lease = self.workers.pool.lease()
        self.failure, self.tools = "", ()
        value = self._call("reset", _reset, (self.workers.spec, self.workers.base_dir, record))
        if value is not None:
            self.tools = tuple(DescribedTool(t["name"], t["description"], t["parameters"]) for t in value)

    def step(self, text: str, calls: Sequence[ToolCall]) -> StepResult:
        value = None if self.failure else self._call("step", _step, (text, list(calls)))
        if value is None:
            return StepResult(done=True, error=self.failure)
        return StepResult(
            tuple(value["observations"]), value["done"], value["reward_parts"], tuple(value["tool_calls"])
        )

    def _call(self, what: str, fn, args: tuple) -> Any:
        if self.lease is None:
            self.failure = f"{what}: the environment was closed"
            return None
        outcome: CallOutcome = self.lease.call(
            fn, args, self.workers.timeout_s, setup=self.workers.setup(), setup_timeout_s=LOAD_TIMEOUT_S
        )
        if outcome.status == "ok":
            return outcome.value
        where = f" (at {outcome.at})" if outcome.at else ""
        message = outcome.message.removeprefix("setup: ")
        self.failure = f"environment {what}: {outcome.status}: {message}{where}"
        return None

    def close(self) -> None:
        """Give the worker back (once; the loop calls it when the episode ends)."""
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        if not self.closed:
            self.closed = True
            self.workers._closed()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - at interpreter exit the pool may be gone
            pass


# ---------------------------------------------------------------- in the worker process

_TARGETS: dict[tuple[str, str], Any] = {}  # (spec, base_dir) -> the class or function, loaded once per worker
_CURRENT: list[Environment] = []  # the environment of the episode this worker serves


def _load(spec: str, base_dir: str) -> None:
    if (spec, base_dir) not in _TARGETS:
        target = load_attribute(spec, base_dir, "environment")
        if not callable(target):
            raise GlassrlError(f"environment {spec!r}: expected a class or a function, got {type(target).__name__}")
        _TARGETS[spec, base_dir] = target
        keep_on_path(spec, base_dir)


def _make(spec: str, base_dir: str) -> Environment:
    on_path()
    _CURRENT.clear()
    return make_checked(spec, _TARGETS[spec, base_dir])


def make_checked(spec: str, target: Any) -> Environment:
    """``target()``, which must be an environment; GlassrlError naming ``spec`` otherwise."""
    try:
        made = target()
    except Exception as err:  # noqa: BLE001 - the user's code
        raise GlassrlError(f"environment {spec!r}: calling it raised {type(err).__name__}: {err}") from None
    if not isinstance(made, Environment):
        raise GlassrlError(
            f"environment {spec!r}: made a {type(made).__name__}, not an environment "
            "(tools, reset(record), step(text, calls))"
        )
    return made


def _check(spec: str, base_dir: str) -> bool:
    _make(spec, base_dir)
    return True


def _reset(spec: str, base_dir: str, record: PromptRecord) -> list[dict[str, Any]]:
    env = _make(spec, base_dir)
    env.reset(record)
    _CURRENT.append(env)
    return [{"name": str(t.name), "description": str(t.description), "parameters": t.parameters} for t in env.tools]


def _step(text: str, calls: list[ToolCall]) -> dict[str, Any]:
    on_path()
    result = _CURRENT[0].step(text, calls)
    if not isinstance(result, StepResult):
        raise TypeError(f"step returned a {type(result).__name__}, not a StepResult")
    return {
        "observations": [as_text(str(o)) for o in result.observations],
        "done": bool(result.done),
        "reward_parts": {str(k): float(v) for k, v in result.reward_parts.items()},
        "tool_calls": [dict(c) for c in result.tool_calls],
    }
