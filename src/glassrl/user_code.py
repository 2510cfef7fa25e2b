"""Loading a user's Python file as a module (reward functions, tools, environments).

A base module: the reward sources and the agent's tool registry both take `path/to/file.py:name`
specs and are sibling layers, so the loader lives below both.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def import_file(path: str | Path, prefix: str) -> ModuleType:
    """The module of the file at ``path`` (loaded once per process).

    One module per file, named ``<prefix>_<hash of the path>``, so two files called rewards.py do
    not collide and neither shadows an installed package of that name. The file's directory is put
    on ``sys.path``, as Python does for a script, so it may import the modules beside it. An
    exception while the file runs is an ImportError naming the path and the exception.
    """
    directory = str(Path(path).resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    name = f"{prefix}_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up while it runs
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001
        del sys.modules[name]
        raise ImportError(f"loading {path} raised {type(err).__name__}: {err}") from None
    return module
