"""docs/algorithms/preference/*.md and distillation/*.md: every test, function and config key a page
names exists, and the index links every page."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from glassrl.rl.config import TrainConfig
from glassrl.supervised.preference_config import PreferenceConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "algorithms"
PAGES = sorted((DOCS / "preference").glob("*.md")) + sorted((DOCS / "distillation").glob("*.md"))
TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
CODE_REF = re.compile(r"`((?:algos|rl|rewards|supervised|ledger|data)/[\w/]+\.py):([\w.]+)`")
KEY = re.compile(r"\| `([a-z_.]+)`(?:, `([a-z_.]+)`)? \|")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_the_page_names_real_tests_functions_and_keys(page):
    text = page.read_text(encoding="utf-8")
    assert "arXiv:" in text
    refs = TEST_REF.findall(text)
    assert refs
    for path, name in refs:
        source = ROOT / path
        assert source.is_file(), f"{page.name}: {path} does not exist"
        assert re.search(rf"^def {name}\(", source.read_text(encoding="utf-8"), re.M), f"{page.name}: no {name}"
    for path, dotted in CODE_REF.findall(text):
        source = (ROOT / "src" / "glassrl" / path).read_text(encoding="utf-8")
        for name in dotted.split("."):
            assert re.search(rf"^\s*(def|class) {name}\b|^{name}\b.*=", source, re.M), (
                f"{page.name}: no {name} in {path}"
            )
    config = TrainConfig if page.parent.name == "distillation" else PreferenceConfig
    section = text.split("## Config keys", 1)[1].split("##", 1)[0]
    for keys in KEY.findall(section):
        for key in filter(None, keys):
            top = key.split(".")[0]
            assert top in {f.name for f in dataclasses.fields(config)}, (
                f"{page.name}: `{key}` is not a {config.__name__} key"
            )


def test_the_index_links_every_page():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for page in PAGES:
        assert f"({page.parent.name}/{page.name})" in index, f"docs/algorithms/README.md does not link {page.name}"
