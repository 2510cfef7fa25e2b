"""UserFunctionSource: "module:function" user rewards with typed results and a per-call timeout."""

from __future__ import annotations

import logging
import re
import textwrap
import threading

import pytest

from glassrl.data.records import PromptRecord
from glassrl.errors import GlassrlError
from glassrl.rewards import RewardRequest, UserFunctionSource

MODULE = "glassrl_test_user_rewards"

SOURCE = '''
import time

def length_ratio(prompt, response, answer, metadata):
    return len(response) / metadata["target"]

def with_steps(prompt, response, answer, metadata):
    return {"score": float(response == answer), "process_rewards": [[1, 0.5], [len(response), 1.0]], "note": prompt}

def sleepy(prompt, response, answer, metadata):
    time.sleep(30)
    return 1.0

def boom(prompt, response, answer, metadata):
    raise ValueError("bad response " + response)

def not_a_number(prompt, response, answer, metadata):
    return "high"

def no_score(prompt, response, answer, metadata):
    return {"value": 1}

def bad_steps(prompt, response, answer, metadata):
    return {"score": 1.0, "process_rewards": [[5, 1.0], [2, 1.0]]}

def nan(prompt, response, answer, metadata):
    return float("nan")

def huge(prompt, response, answer, metadata):
    return 10**400

def nan_step(prompt, response, answer, metadata):
    return {"score": 1.0, "process_rewards": [[1, float("nan")]]}

def odd_details(prompt, response, answer, metadata):
    import datetime
    return {"score": True, "when": datetime.date(2025, 1, 2), "tags": {"b", "a"}, "inf": float("inf"), 3: (1, 2)}

def keyword_only(prompt, response, *, answer, metadata):
    return 1.0

def two_arguments(prompt, response):
    return 1.0

NOT_CALLABLE = 3
'''


@pytest.fixture(autouse=True)
def user_module(tmp_path_factory, monkeypatch):
    directory = tmp_path_factory.getbasetemp() / "user_module"
    directory.mkdir(exist_ok=True)
    (directory / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.syspath_prepend(str(directory))


def requests(*responses: str) -> list[RewardRequest]:
    record = PromptRecord("1+1=", "2", {"target": 4}, "t#0")
    return [RewardRequest("1+1=", r, record) for r in responses]


def one(name: str, response: str = "2", timeout_s: float = 5.0):
    (result,) = UserFunctionSource(f"{MODULE}:{name}", timeout_s=timeout_s).score(requests(response))
    return result


def test_number_and_dict_results():
    results = UserFunctionSource(f"{MODULE}:length_ratio").score(requests("ab", "abcd", ""))
    assert [(r.status, r.score) for r in results] == [("ok", 0.5), ("ok", 1.0), ("ok", 0.0)]
    result = one("with_steps", "22")
    assert (result.status, result.score) == ("ok", 0.0)
    assert (result.process_rewards, result.details) == (((1, 0.5), (2, 1.0)), {"note": "1+1="})
    # For "2" both steps end at character 1: two steps on one token would merge silently.
    assert one("with_steps", "2").status == "error"


def test_timeout_then_the_source_still_works():
    result = one("sleepy", timeout_s=0.5)
    assert result.status == "timeout" and result.score is None and f"{MODULE}:sleepy" in result.message
    assert one("length_ratio", "abcd").score == 1.0


def test_timeout_from_a_non_main_thread():
    out = []
    thread = threading.Thread(target=lambda: out.append(one("sleepy", timeout_s=0.3)))
    thread.start()
    thread.join()
    assert out[0].status == "timeout"


def test_raising_function_is_an_error_with_its_message():
    result = one("boom", "xyz")
    assert result.status == "error" and result.score is None
    assert result.message == f"{MODULE}:boom: ValueError: bad response xyz"


def test_raising_function_carries_its_traceback_and_the_users_line(tmp_path_factory):
    # issue 31, item 13: the trainer names the user's file:line and writes the traceback
    result = one("boom", "xyz")
    module = tmp_path_factory.getbasetemp() / "user_module" / f"{MODULE}.py"
    line = 1 + textwrap.dedent(SOURCE).splitlines().index('    raise ValueError("bad response " + response)')
    assert result.at == f"{module}:{line}"
    assert f'File "{module}", line {line}, in boom' in result.traceback
    assert result.traceback.rstrip().endswith("ValueError: bad response xyz")


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("not_a_number", "score must be a number"),
        ("no_score", "without 'score'"),
        ("bad_steps", "increasing"),
        ("nan", "must be a finite number, got nan"),
        ("huge", "must be a finite number, got an integer of 1329 bits"),
        ("nan_step", "process reward at 1 must be a finite number"),
    ],
)
def test_malformed_return_values_are_errors(name, fragment):
    result = one(name, "abcdef")
    assert result.status == "error" and fragment in result.message


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("no_colon", "expected 'module:function'"),
        ("glassrl_no_such_module_xyz:f", "cannot import module 'glassrl_no_such_module_xyz'"),
        (f"{MODULE}:missing", "has no attribute 'missing'"),
        (f"{MODULE}:NOT_CALLABLE", "not callable"),
    ],
)
def test_bad_specs_are_errors_naming_the_spec(spec, fragment):
    with pytest.raises(GlassrlError, match=fragment) as info:
        UserFunctionSource(spec)
    assert repr(spec) in str(info.value)


def test_timeout_must_be_positive():
    with pytest.raises(GlassrlError, match="timeout_s"):
        UserFunctionSource(f"{MODULE}:length_ratio", timeout_s=0)
    with pytest.raises(GlassrlError, match="memory_limit_mb must be >= 1 or null"):
        UserFunctionSource(f"{MODULE}:length_ratio", memory_limit_mb=0)
    with pytest.raises(GlassrlError, match="unknown style 'openrlhf'; valid: auto, glassrl, trl, verl"):
        UserFunctionSource(f"{MODULE}:length_ratio", style="openrlhf")


def test_details_become_plain_data():
    """Whatever the function returns is converted in the worker: a date, a set, inf and a
    non-string key arrive as JSON can carry them."""
    result = one("odd_details")
    assert (result.status, result.score) == ("ok", 1.0)
    assert result.details == {"when": "2025-01-02", "tags": ["a", "b"], "inf": None, "3": [1, 2]}


@pytest.mark.parametrize(
    "name, style, fragment",
    [
        ("keyword_only", "glassrl", r"style 'glassrl' calls fn\(prompt, response, answer, metadata\)"),
        ("two_arguments", "auto", r"cannot tell its style from fn\(prompt, response\); set style"),
        ("length_ratio", "verl", r"style 'verl' calls compute_score\(.*\); the function also requires 'prompt'"),
        ("length_ratio", "trl", r"style 'trl' calls fn\(prompts=.*it takes no 'completions'"),
    ],
)
def test_a_signature_the_style_cannot_call_is_refused_at_start(name, style, fragment):
    with pytest.raises(GlassrlError, match=fragment):
        UserFunctionSource(f"{MODULE}:{name}", style=style)


def test_the_detected_style_is_logged_once(caplog):
    caplog.set_level(logging.WARNING, logger="glassrl.rewards.user_function")
    source = UserFunctionSource(f"{MODULE}:length_ratio")
    source.score(requests("ab", "abcd"))
    assert source.style == "glassrl"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "glassrl style, detected from fn(prompt, response, answer, metadata)" in lines[0]
    caplog.clear()
    UserFunctionSource(f"{MODULE}:length_ratio", style="glassrl")
    assert caplog.records == []  # an explicit style is not announced


def test_a_file_path_relative_to_base_dir_needs_no_pythonpath(tmp_path):
    config_dir = tmp_path / "project"
    (config_dir / "rewards").mkdir(parents=True)
    (config_dir / "rewards" / "helpers.py").write_text("def bonus(text):\n    return 0.5 * text.count('!')\n")
    (config_dir / "rewards" / "my_rewards.py").write_text(
        "from helpers import bonus\n\ndef excited(prompt, response, answer, metadata):\n    return bonus(response)\n"
    )
    source = UserFunctionSource("rewards/my_rewards.py:excited", base_dir=str(config_dir))
    assert [r.score for r in source.score(requests("!", "!!!!"))] == [0.5, 2.0]
    with pytest.raises(GlassrlError, match="no file .*nope.py .*a relative path is read from"):
        UserFunctionSource("rewards/nope.py:excited", base_dir=str(config_dir))
    (config_dir / "broken.py").write_text("raise RuntimeError('no GPU here')\n")
    with pytest.raises(GlassrlError, match="loading .*broken.py raised RuntimeError: no GPU here"):
        UserFunctionSource("broken.py:f", base_dir=str(config_dir))


def test_a_missing_command_line_reward_file_is_named_as_typed(tmp_path, monkeypatch):
    """Issue 44: a reward path given on the command line is the working directory's; its error named
    the absolute path and said relative paths are read from the config's directory."""
    from glassrl.config import load_config
    from glassrl.rl.config import TrainConfig

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "c.yaml").write_text("steps: 1\n")
    monkeypatch.chdir(tmp_path)
    override = "reward.sources=[{name: user_function, spec: 'myrewards.py:score'}]"
    cfg = load_config(TrainConfig, "configs/c.yaml", [override])
    message = (
        f"user function 'myrewards.py:score': no file myrewards.py (read from the working directory "
        f"{tmp_path.resolve()})"
    )
    with pytest.raises(GlassrlError, match=re.escape(message) + "$"):
        UserFunctionSource(cfg.reward.sources[0]["spec"], base_dir=cfg.reward.base_dir)
