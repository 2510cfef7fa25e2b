"""UserFunctionSource: "module:function" user rewards with typed results and a per-call timeout."""

from __future__ import annotations

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


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("not_a_number", "score must be a number"),
        ("no_score", "without 'score'"),
        ("bad_steps", "increasing"),
        ("nan", "must be a number"),
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
