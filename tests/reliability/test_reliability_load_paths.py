"""Nothing glassrl reads runs code (issue 32, item 1): every place in the package that could
unpickle, or run code named by a file, is one docs/reliability.md accounts for.

A scan of the source, so that a new ``torch.load`` without ``weights_only=True``, a new
``pickle.load``, an unsafe YAML loader or ``trust_remote_code=True`` fails here and is weighed
("Nothing read from a run directory runs code" in docs/reliability.md) before it ships.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import glassrl

PACKAGE = Path(glassrl.__file__).resolve().parent
# module -> why it may unpickle
PICKLE_ALLOWED = {
    "worker_pool.py": "the worker unpickles what its own caller sent; the caller reads JSON back",
    "run/sharded.py": "DCP's old format, through an unpickler that builds DCP's metadata classes only",
}
UNSAFE_YAML = {"load", "unsafe_load", "full_load", "load_all", "unsafe_load_all", "full_load_all"}


def _calls(tree: ast.AST):
    """(owner, attribute, call) of each call: ("torch", "load", …) for ``torch.load(…)``, (None, None, …)
    for ``f(…)``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
            yield owner, func.attr if isinstance(func, ast.Attribute) else None, node


def _keyword(call: ast.Call, name: str):
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value.value if isinstance(keyword.value, ast.Constant) else "<not a constant>"
    return None


def _findings() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(PACKAGE))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for owner, attr, call in _calls(tree):
            where = f"{module}:{call.lineno}"
            if owner == "torch" and attr == "load" and _keyword(call, "weights_only") is not True:
                found.append(f"{where}: torch.load without weights_only=True")
            if owner == "pickle" and attr in {"load", "loads", "Unpickler"} and module not in PICKLE_ALLOWED:
                found.append(f"{where}: pickle.{attr}")
            if owner == "yaml" and attr in UNSAFE_YAML and module != "config.py":  # config.py: a SafeLoader subclass
                found.append(f"{where}: yaml.{attr}")
            if _keyword(call, "trust_remote_code") not in (None, False):
                found.append(f"{where}: trust_remote_code")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and module not in PICKLE_ALLOWED:
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                if "Unpickler" in bases:
                    found.append(f"{module}:{node.lineno}: an Unpickler")
    return found


def test_nothing_in_the_package_unpickles_or_runs_code_it_reads():
    assert _findings() == []


def test_the_scan_finds_what_it_looks_for(tmp_path, monkeypatch):
    """The scan's control: each pattern it refuses, in a module of its own, is found."""
    (tmp_path / "bad.py").write_text(
        "import pickle, torch, yaml\n"
        "torch.load('x')\n"
        "torch.load('x', weights_only=False)\n"
        "pickle.loads(b'')\n"
        "yaml.load('a', Loader=yaml.Loader)\n"
        "f(trust_remote_code=True)\n"
        "class U(pickle.Unpickler): pass\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert [f.split(": ", 1)[1] for f in _findings()] == [
        "torch.load without weights_only=True",
        "torch.load without weights_only=True",
        "pickle.loads",
        "yaml.load",
        "trust_remote_code",
        "an Unpickler",
    ]
