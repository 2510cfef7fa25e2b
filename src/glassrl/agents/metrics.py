"""Tool-use metrics of multi-turn batches (keys and formulas: docs/metrics.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence

# A tool call's status (glassrl.agents.tools.ToolResult); each has a tool/calls/<status> rate.
CALL_STATUSES = ("ok", "error", "timeout")


def tool_use(turns: Sequence) -> tuple[bool, bool]:
    """(called a tool, some call ran: status ok) of one multi-turn response's turns."""
    calls = [c for t in turns for c in t.tool_calls]
    return bool(calls), any(c.get("status") == "ok" for c in calls)


def turn_metrics(rollout) -> dict[str, float]:
    """Multi-turn batches (docs/metrics.md): response/turns/mean, response/observation_tokens/mean,
    tool/… from each turn's tool-call records, reward/env/<part>/mean from the environment's reward parts."""
    turns = rollout.turns
    B = len(turns)
    statuses = [c.get("status") for response in turns for t in response for c in t.tool_calls]
    used = [tool_use(response) for response in turns]
    observed = (rollout.response_context_mask & ~rollout.response_mask).sum(-1).float()  # (B,)
    metrics = {
        "response/turns/mean": sum(len(t) for t in turns) / B,
        "response/observation_tokens/mean": observed.mean().item(),
        "tool/calls/mean": len(statuses) / B,
        "tool/call_rate": sum(called for called, _ in used) / B,
        "tool/valid_call_rate": sum(valid for _, valid in used) / B,
        "agent/env_error_rate": sum(bool(t) and t[-1].finish_reason == "env_error" for t in turns) / B,
    }
    for status in CALL_STATUSES:
        metrics[f"tool/calls/{status}"] = statuses.count(status) / len(statuses) if statuses else math.nan
    parts = sorted({name for response in turns for t in response for name in t.reward_parts})
    for name in parts:
        totals = [sum(t.reward_parts.get(name, 0.0) for t in response) for response in turns]
        metrics[f"reward/env/{name}/mean"] = sum(totals) / B
    return metrics
