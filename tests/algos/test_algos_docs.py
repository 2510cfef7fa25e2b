"""docs/algorithms/*.md cite glassrl.algos by path and name; every citation must exist."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs" / "algorithms").glob("*.md"))
# `algos/advantages/group.py:estimate_remax`, `algos/aggregation.py:aggregate`, `algos/aggregation.py`
CODE_REF = re.compile(r"`(algos/[\w/]+\.py)(?::([\w.]+))?`")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_algos_citations_name_real_files_and_functions(page):
    for path, name in CODE_REF.findall(page.read_text(encoding="utf-8")):
        source = ROOT / "src" / "glassrl" / path
        assert source.is_file(), f"{page.name}: {path} does not exist"
        if name:
            pattern = rf"^(def|class) {name}\b|^{name}\b[^=\n]*="
            assert re.search(pattern, source.read_text(encoding="utf-8"), re.M), f"{page.name}: no {name} in {path}"
