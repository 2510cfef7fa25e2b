"""docs/metrics.md: well-formed rows, the required keys, placeholder matching."""

from __future__ import annotations

import re

import pytest

from glassrl.errors import GlassrlError
from glassrl.report.metrics_doc import KEY_PATTERN, documented_patterns, is_documented, rows, undocumented

# The keys issue 5 asks for (one per quantity of "Metrics and the ledger").
REQUIRED = """
reward/<source>/mean reward/<source>/std reward/mean reward/std reward/failures/timeout
reward/failures/error reward/failure_rate task/accuracy response/length/mean response/length/max
response/length/min response/truncation_rate response/distinct_1 response/distinct_2 kl/mean kl/beta
actor/entropy actor/clip_frac_low actor/clip_frac_high actor/dual_clip_frac actor/approx_kl
actor/policy_loss actor/kl_loss actor/grad_norm actor/lr critic/value_loss critic/vf_clip_frac
critic/explained_variance critic/grad_norm critic/lr critic/values/mean advantage/mean advantage/std
advantage/min advantage/max returns/mean returns/std eval/accuracy perf/<phase>_s
perf/<phase>_tokens_per_s perf/step_s
""".split()


def test_every_row_is_well_formed():
    found = rows()
    assert len(found) >= len(REQUIRED)
    for namespace, key in found:
        assert KEY_PATTERN.fullmatch(key), key
        assert key.split("/")[0] == namespace, f"{key} sits under ## `{namespace}/`"
        assert set(re.findall(r"<([a-z_]+)>", key)) <= {"source", "phase", "value"}, key
    keys = [key for _, key in found]
    assert len(keys) == len(set(keys)), "a key is documented twice"


def test_every_row_has_a_formula_and_a_unit():
    from glassrl.report.metrics_doc import DEFAULT_PATH

    for line in DEFAULT_PATH.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)]
        if len(cells) > 2 and cells[0] == "" and re.fullmatch(r"`[^`]+`", cells[1]):
            assert len(cells) == 5 and cells[2] and cells[3] and cells[4] == "", line


def test_the_required_keys_are_documented():
    assert [key for key in REQUIRED if key not in documented_patterns()] == []


def test_placeholders_match_one_segment():
    assert is_documented("reward/arith_verify/mean")
    assert is_documented("reward/user_function:2/std")
    assert is_documented("perf/generate_s") and is_documented("perf/generate_tokens_per_s")
    assert is_documented("reward/mean") and is_documented("critic/values/mean")
    assert not is_documented("reward/a/b/mean")  # <source> is one segment
    assert not is_documented("perf/_s")  # a placeholder is not empty
    assert not is_documented("reward/means")
    assert not is_documented("actor/clip_frac")
    assert undocumented(["kl/mean", "foo/bar", "eval/accuracy", "foo/bar"]) == ["foo/bar"]


def test_parser_on_a_small_page(tmp_path):
    page = tmp_path / "m.md"
    page.write_text(
        "# M\n\n| key | formula | notes |\n|---|---|---|\n\n## `x/`\n\n| key | formula | notes |\n|---|---|---|\n"
        "| `x/<phase>_s` | a \\| b | s |\n| not a key | - | - |\n\n## `y/`\n| `y/z` | 1 | - |\n",
        encoding="utf-8",
    )
    assert rows(page) == [("x", "x/<phase>_s"), ("y", "y/z")]
    assert is_documented("x/update_s", page) and not is_documented("x/update", page)
    page.write_text("| `x/a` | 1 | - |\n", encoding="utf-8")
    with pytest.raises(GlassrlError, match=r"m\.md:1: key row `x/a` outside"):
        rows(page)
    with pytest.raises(GlassrlError, match="metrics documentation is missing"):
        rows(tmp_path / "none.md")
