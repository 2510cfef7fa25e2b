"""Tools: the calculator (hand table, refusals, and equal to Python on random integers), argument
checks, calls that fail in every way become results that say what was wrong, the registry."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassrl.agents.calculator import Calculator, evaluate
from glassrl.agents.registry import BUILTIN_TOOLS, build_tool, build_tools
from glassrl.agents.tasks import environment_factory
from glassrl.agents.tools import FunctionTool, ToolCall, check_arguments, run_call, schema, tool_map
from glassrl.errors import GlassrlError


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("4821+975", "5796"),
        ("123+456", "579"),
        ("2*(3+4)", "14"),
        ("-7//2", "-4"),
        ("7 % 3", "1"),
        ("2**10", "1024"),
        ("10/4", "2.5"),
        ("12/4", "3"),  # exact division stays an integer
        ("1/3", "0.333333333333"),
        ("１２３＋４５６", "579"),  # full-width forms
        ("99999999999999999999+1", "100000000000000000000"),  # big integers are exact
        ("4821+975=", "5796"),  # a trailing "=" as in the prompt
    ],
)
def test_calculator_hand_table(expression, expected):
    assert Calculator().call({"expression": expression}) == expected


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('ls')", "not allowed"),
        ("abs(-1)", "not allowed"),
        ("x + 1", "not allowed"),
        ("(1).real", "not allowed"),
        ("'a' * 3", "not allowed"),
        ("1 < 2", "not allowed"),
        ("2 ** 100000", "exponent"),
        ("999 ** 999", "digits"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 201, "longer than"),
    ],
)
def test_calculator_refuses_anything_but_arithmetic(expression, message):
    with pytest.raises(ValueError, match=message):
        evaluate(expression)


@settings(max_examples=200, deadline=None)
@given(a=st.integers(-(10**12), 10**12), b=st.integers(-(10**12), 10**12), op=st.sampled_from(["+", "-", "*"]))
def test_calculator_equals_python_on_integers(a, b, op):
    assert evaluate(f"{a}{op}({b})") == {"+": a + b, "-": a - b, "*": a * b}[op]


PARAMS = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "k": {"type": "integer"}, "mode": {"type": "string", "enum": ["a", "b"]}},
    "required": ["q"],
}


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"q": "x"}, None),
        ({"q": "x", "k": 3, "mode": "a"}, None),
        ([1], "must be a JSON object"),
        ({}, "missing argument 'q'"),
        ({"q": "x", "z": 1}, "unknown argument 'z'"),
        ({"q": 1}, "'q' must be a string"),
        ({"q": "x", "k": 1.5}, "'k' must be a integer"),
        ({"q": "x", "k": True}, "'k' must be a integer"),  # JSON true is not a number
        ({"q": "x", "mode": "c"}, "must be one of"),
    ],
)
def test_check_arguments_table(arguments, problem):
    found = check_arguments(PARAMS, arguments)
    assert found is None if problem is None else problem in found


def lookup(city: str, days: int = 1) -> str:
    """Weather for a city.

    More text."""
    return f"{city}: sunny for {days} day(s)"


def test_function_tool_schema_from_signature():
    tool = FunctionTool(lookup)
    assert (tool.name, tool.description) == ("lookup", "Weather for a city.")
    assert tool.parameters == {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    }
    assert schema(tool)["function"]["name"] == "lookup"
    assert tool.call({"city": "Paris", "days": 2}) == "Paris: sunny for 2 day(s)"


class Raises:
    name, description = "raises", "always fails"
    parameters = {"type": "object", "properties": {}, "required": []}

    def call(self, arguments):
        raise RuntimeError("disk on fire")


class Waits:
    """Blocks until released: a call that outlives its time limit."""

    name, description = "waits", "never answers in time"
    parameters = {"type": "object", "properties": {}, "required": []}

    def __init__(self):
        self.release = threading.Event()

    def call(self, arguments):
        self.release.wait(30)
        return "late"


@pytest.mark.parametrize(
    ("call", "status", "text"),
    [
        (ToolCall("calculator", text="4821+975"), "ok", "5796"),  # bare text -> the one string argument
        (ToolCall("calculator", arguments={"expression": "2*3"}), "ok", "6"),
        (
            ToolCall("calculator", error="malformed JSON arguments: Expecting value at character 15"),
            "error",
            "malformed",
        ),
        (ToolCall("calculater", arguments={}), "error", "unknown tool 'calculater' (available: calculator, raises"),
        (ToolCall("calculator", arguments={"expr": "1"}), "error", "missing argument 'expression'"),
        (ToolCall("calculator", arguments={"expression": 5}), "error", "'expression' must be a string"),
        (ToolCall("calculator", arguments={"expression": "1/0"}), "error", "ZeroDivisionError: division by zero"),
        (ToolCall("calculator", arguments={"expression": "os.system('x')"}), "error", "ValueError: not allowed"),
        (ToolCall("raises", arguments={}), "error", "error: raises: RuntimeError: disk on fire"),
        (ToolCall("raises", text="hello"), "error", "takes a JSON object of arguments"),
    ],
)
def test_run_call_never_raises_and_says_what_was_wrong(call, status, text):
    tools = tool_map([Calculator(), Raises(), Waits()])
    result = run_call(tools, call, timeout_s=10.0)
    assert result.status == status and text in result.text
    assert result.text.startswith("error: ") == (status != "ok")


def test_run_call_time_limit():
    waits = Waits()
    result = run_call(tool_map([waits]), ToolCall("waits", arguments={}), timeout_s=0.2)
    waits.release.set()
    assert result.status == "timeout" and "no answer within 0.2 s" in result.text


def test_tool_names_must_be_valid_and_unique():
    with pytest.raises(ValueError, match="used twice"):
        tool_map([Calculator(), Calculator()])
    bad = FunctionTool(lookup, name="bad name")
    with pytest.raises(ValueError, match="must match"):
        tool_map([bad])


def test_builtins_are_tools_with_schemas():
    tools = build_tools(list(BUILTIN_TOOLS))
    assert [t.name for t in tools] == ["calculator", "python", "search", "open_page"]
    for tool in tools:
        assert tool.parameters["type"] == "object" and tool.parameters["required"]


def test_user_tools_by_module_and_by_file_relative_to_base_dir(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "mine.py").write_text(
        "def shout(text: str) -> str:\n"
        "    '''Upper-case the text.'''\n"
        "    return text.upper()\n"
        "\n"
        "class Echo:\n"
        "    name, description = 'echo', 'echo back'\n"
        "    parameters = {'type': 'object', 'properties': {'text': {'type': 'string'}}, 'required': ['text']}\n"
        "    def call(self, arguments):\n"
        "        return arguments['text']\n"
    )
    shout = build_tool("tools/mine.py:shout", base_dir=tmp_path)
    echo = build_tool("tools/mine.py:Echo", base_dir=tmp_path)
    assert shout.call({"text": "hi"}) == "HI" and echo.call({"text": "hi"}) == "hi"
    by_module = build_tool(f"{__name__}:lookup")
    assert by_module.name == "lookup"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("calculatr", "not a built-in"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("glassrl.errors:nothing", "has no attribute 'nothing'"),
        ("glassrl.errors:GlassrlError", "expected a tool"),
        ("missing.py:f", "no file"),
        ("bad.py:f", "loading"),
    ],
)
def test_bad_tool_specs_are_one_error_naming_the_spec(spec, message, tmp_path):
    (tmp_path / "bad.py").write_text("raise ImportError('broken')\n")
    with pytest.raises(GlassrlError, match=message) as info:
        build_tool(spec, base_dir=tmp_path)
    assert repr(spec) in str(info.value)


def test_repeated_tool_names_are_an_error():
    with pytest.raises(GlassrlError, match="used twice"):
        build_tools(["calculator", "calculator"])


def test_file_tools_of_the_same_file_load_once(tmp_path):
    path = Path(tmp_path / "count.py")
    path.write_text("LOADS = []\nLOADS.append(1)\ndef f(x: str) -> str:\n    return str(len(LOADS))\n")
    a, b = build_tool("count.py:f", base_dir=tmp_path), build_tool(f"{path}:f")
    assert a.call({"x": ""}) == b.call({"x": ""}) == "1"


class Exits:
    """Calls sys.exit: stopped training with a misleading KeyError('text') (issue 33, item 4)."""

    name, description = "exits", "calls sys.exit"
    parameters = {"type": "object", "properties": {}, "required": []}

    def call(self, arguments):
        raise SystemExit(3)


class Interrupts(Exits):
    name = "interrupts"

    def call(self, arguments):
        raise KeyboardInterrupt


@pytest.mark.parametrize(("tool", "raised"), [(Exits(), "SystemExit: 3"), (Interrupts(), "KeyboardInterrupt")])
def test_a_tool_that_exits_is_an_error_observation(tool, raised):
    result = run_call(tool_map([tool]), ToolCall(tool.name, arguments={}), timeout_s=10.0)
    assert result.status == "error" and result.text == f"error: {tool.name}: {raised}"


def test_tool_and_environment_files_import_the_modules_beside_them(tmp_path):
    # issue 31, item 5: reward files could, tool and environment files could not
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "glassrl_test_neighbour_31.py").write_text("def twice(text):\n    return text * 2\n")
    (tmp_path / "user" / "my_tools.py").write_text(
        "from glassrl_test_neighbour_31 import twice\n"
        "def double(text: str) -> str:\n"
        "    '''Repeat the text.'''\n"
        "    return twice(text)\n"
        "def later(text: str) -> str:\n"
        "    '''Repeat the text, importing the neighbour when called.'''\n"
        "    from glassrl_test_neighbour_37 import twice as again\n"
        "    return again(text)\n"
    )
    (tmp_path / "user" / "my_env.py").write_text(
        "from glassrl_test_neighbour_31 import twice\n"
        "from glassrl.agents.environment import ToolEnvironment\n"
        "from glassrl.agents.calculator import Calculator\n"
        "def make():\n"
        "    assert twice('a') == 'aa'\n"
        "    return ToolEnvironment([Calculator()])\n"
    )
    assert build_tool("user/my_tools.py:double", base_dir=tmp_path).call({"text": "ab"}) == "abab"
    # a neighbour imported only when called, in the one worker (which resets sys.path for each call)
    (tmp_path / "user" / "glassrl_test_neighbour_37.py").write_text("def twice(text):\n    return text * 2\n")
    later = build_tool("user/my_tools.py:later", base_dir=tmp_path, processes=1)
    assert [later.call({"text": t}) for t in ("a", "b")] == ["aa", "bb"]
    assert environment_factory("user/my_env.py:make", base_dir=tmp_path)() is not None
