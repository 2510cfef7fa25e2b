"""The run report opened in headless Chromium (Debian's ``chromium``, driven by Playwright).

Checks what only a browser can: the page runs with no console error and no request
leaving file://, every chart is drawn, the token view has one span per ledger token,
clicking a token shows that token's ledger values, and switching the quantity
recolours the tokens. Saves a screenshot. Skips, saying why, where Chromium or
Playwright is absent (.ci/run installs Chromium, so CI runs it). Never runs
``playwright install``: the browser is the system's.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from glassrl.ledger import read_jsonl
from glassrl.ledger.legend import token_legend
from glassrl.ledger.phrases import label
from glassrl.ledger.render import fmt
from helpers import EXAMPLES

pytestmark = pytest.mark.slow  # Chromium end to end

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")


# session scope, like the runs it opens, so that a missing Chromium skips before any run trains
@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).is_file() and shutil.which("chromium") is None:
        pytest.skip(f"Chromium is not installed ({CHROMIUM} absent): apt-get install chromium (.ci/run does)")
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("Playwright for Python is not installed: pip install -e '.[test]'")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        executable = CHROMIUM if Path(CHROMIUM).is_file() else shutil.which("chromium")
        browser = p.chromium.launch(executable_path=executable, args=ARGS)
        yield browser
        browser.close()


class Page:
    """A page that records console errors, page errors, failed requests and requests leaving file://."""

    def __init__(self, browser, url: str) -> None:
        self.errors: list[str] = []
        self.remote: list[str] = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 1300})
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url[:120]} {r.failure}"))
        self.page.on("request", lambda r: r.url.startswith(LOCAL_SCHEMES) or self.remote.append(r.url))
        self.page.goto(url, wait_until="load")

    def text(self, selector: str) -> str:
        return self.page.inner_text(selector).strip()

    def backgrounds(self) -> list[str]:
        return self.page.eval_on_selector_all(
            ".tok[data-b]:not(.obs)", "els => els.map(e => getComputedStyle(e).backgroundColor)"
        )

    def legend(self) -> list[list[str]]:
        """[element id, text] of each token line of the legend panel."""
        return self.page.eval_on_selector_all(
            "#token-legend > div[id^='legend-']:not(#legend-baselines)", "els => els.map(e => [e.id, e.textContent])"
        )

    def check_clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.remote == [], f"requests left file://: {self.remote}"


@pytest.fixture(scope="module")
def run_report(browser, runs, tmp_path_factory):
    from glassrl.report.html import write_run_report

    out = write_run_report([runs["ppo"], runs["grpo"]], tmp_path_factory.mktemp("browser") / "report.html")
    return runs, out


def test_report_renders_and_shows_the_ledger_of_a_clicked_token(browser, run_report, tmp_path):
    runs, out = run_report
    view = Page(browser, out.as_uri())
    page = view.page
    page.wait_for_function(
        "document.querySelectorAll('.chart').length > 0 && [...document.querySelectorAll('.chart')]"
        ".every(c => c.querySelector('.main-svg'))",
        timeout=20000,
    )
    charts = page.eval_on_selector_all(
        ".chart",
        "els => els.map(e => [e.dataset.chart, "
        "e.querySelectorAll('.main-svg').length, e.querySelectorAll('.trace').length])",
    )
    assert len(charts) >= 10 and all(svgs > 0 and traces > 0 for _, svgs, traces in charts), charts

    ledger = read_jsonl(runs["ppo"] / "ledgers" / "step_000002.jsonl")  # shown first: the first run's last step
    assert page.input_value("#step-select") == "1" and page.inner_text("#step-select option:checked") == "2"
    assert page.locator(".tok[data-b]").count() == sum(len(r.tokens) for r in ledger.responses)
    for b, resp in enumerate(ledger.responses):
        assert page.locator(f'.tok[data-b="{b}"]').count() == resp.length

    b, i = 1, 2
    token = ledger.responses[b].tokens[i]
    assert token.response_mask and token.values is not None
    page.click(f"#tok-{b}-{i}")
    assert "selected" in page.get_attribute(f"#tok-{b}-{i}", "class")
    for name in ("advantages", "returns", "values", "kl", "token_rewards", "deltas", "whitened_advantages", "logprobs"):
        assert view.text(f"#field-{name}") == fmt(getattr(token, name)), name
    assert view.text("#field-token") == f'"{token.token}"'
    assert view.text("#field-index") == str(i) and view.text("#field-response_mask") == "True"
    assert view.text("#field-score") == fmt(ledger.responses[b].score)
    assert view.text("#field-length") == str(ledger.responses[b].length)
    assert view.text("#field-finish_reason") == ledger.responses[b].finish_reason
    assert view.text("#field-estimator") == "gae"
    # The legend is the Python legend's text (glassrl.ledger.legend), label then line, nothing composed in the page.
    assert view.legend() == [[f"legend-{x.key}", label(x.key) + x.text] for x in token_legend(ledger, b, i)]
    reward = view.text("#legend-reward")
    assert f"= {fmt(token.token_scores)} − " in reward and reward.endswith(f"= {fmt(token.token_rewards)}")
    assert view.text("#legend-return").startswith(f"returnR_{i} = A_{i} + V(s_{i}) = {fmt(token.advantages)} + ")

    before = view.backgrounds()
    page.select_option("#quantity-select", "kl")
    after = view.backgrounds()
    assert len(before) == len(after) and before != after
    kl = [float(v) for v in page.eval_on_selector_all(".tok[data-b]", "els => els.map(e => e.dataset.value)")]
    assert kl == [t.kl for r in ledger.responses for t in r.tokens]
    assert view.text("#field-kl") == fmt(token.kl)  # the selection survives the switch
    page.hover(f"#tok-{b}-{i}")
    assert view.text("#token-tooltip").startswith(f'a_{i} = "{token.token}"')

    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000, f"screenshot {shot}"
    page.select_option("#step-select", "0")
    first = read_jsonl(runs["ppo"] / "ledgers" / "step_000001.jsonl")
    assert page.locator(".tok[data-b]").count() == sum(len(r.tokens) for r in first.responses)
    page.select_option("#source-select", "1")
    assert view.text("#run-line").startswith("grpo: step 2 · estimator grpo")
    page.click("#tok-0-0")
    grpo = read_jsonl(runs["grpo"] / "ledgers" / "step_000002.jsonl")
    assert view.legend() == [[f"legend-{x.key}", label(x.key) + x.text] for x in token_legend(grpo, 0, 0)]
    assert view.text("#legend-baselines").startswith("Baselines (how each response's advantage follows")
    view.check_clean()
    print(f"screenshot: {shot}")


def test_explain_page_marks_observation_tokens(browser, tmp_path):
    from glassrl.cli import build_parser
    from glassrl.commands import explain, explain_input
    from glassrl.report.html import write_explain_html

    source = EXAMPLES / "explain" / "observation_tokens.json"
    ledger = explain.build_ledger(
        explain_input.from_args(build_parser(only="explain").parse_args(["explain", "--input", str(source)]))
    )
    out = write_explain_html(ledger, tmp_path / "explain.html")
    view = Page(browser, out.as_uri())
    page = view.page
    assert page.locator(".tok[data-b]").count() == 8
    assert page.eval_on_selector_all(".tok.obs[data-b]", "els => els.map(e => e.dataset.i)") == ["3", "4", "5"]
    assert page.locator(".obs-tag").count() == 1 and page.is_hidden("#step-control")
    obs_background = page.eval_on_selector("#tok-0-4", "e => getComputedStyle(e).backgroundImage")
    assert "repeating-linear-gradient" in obs_background  # hatched
    page.click("#tok-0-4")
    assert view.text("#field-response_mask") == "False" and view.text("#field-advantages") == "—"
    assert view.text("#legend-obs").startswith("obsa_4 is an observation token (mask 0)")
    page.click("#tok-0-2")
    token = ledger.responses[0].tokens[2]
    assert view.text("#legend-TD").endswith("carried)")  # δ_2 bootstraps from V(s_6) across the observation
    assert (
        f"γ·V(s_6) − V(s_2) = {fmt(token.token_rewards)} + 1·{fmt(ledger.responses[0].tokens[6].values)}"
        in view.text("#legend-TD")
    )
    assert view.text("#field-deltas") == fmt(token.deltas) == "0.3980"
    page.screenshot(path=str(tmp_path / "explain.png"), full_page=True)
    view.check_clean()
    zh = Page(browser, write_explain_html(ledger, tmp_path / "explain-zh.html", lang="zh").as_uri())
    zh.page.click("#tok-0-2")
    assert zh.legend() == [[f"legend-{x.key}", label(x.key, "zh") + x.text] for x in token_legend(ledger, 0, 2, "zh")]
    assert zh.text("#legend-TD").endswith("观测 token 3…5 被跨过）")
    zh.check_clean()


def test_explain_page_shows_turns(browser, tmp_path):
    from glassrl.cli import build_parser
    from glassrl.commands import explain, explain_input
    from glassrl.ledger.legend import turn_legend
    from glassrl.report.html import write_explain_html

    source = EXAMPLES / "explain" / "tool_turns.json"
    ledger = explain.build_ledger(
        explain_input.from_args(build_parser(only="explain").parse_args(["explain", "--input", str(source)]))
    )
    view = Page(browser, write_explain_html(ledger, tmp_path / "turns.html").as_uri())
    page = view.page
    tags = page.eval_on_selector_all(".turn-tag", "els => els.map(e => [e.id, e.textContent, e.title])")
    assert [t[:2] for t in tags] == [["turn-0-0", "turn 0 · tool_call"], ["turn-0-1", "turn 1 · stop"]]
    assert tags[0][2] == "turn 0: tokens 0…3, finish tool_call; calls calculator: ok"
    # each tag stands right before its turn's first token; the observation 4…6 is hatched
    first = page.eval_on_selector_all(".turn-tag", "els => els.map(e => e.nextElementSibling.id)")
    assert first == ["tok-0-0", "tok-0-7"]
    assert page.eval_on_selector_all(".tok.obs[data-b]", "els => els.map(e => e.dataset.i)") == ["4", "5", "6"]
    assert view.text("#turns-0") == "\n".join(turn_legend(ledger, 0))
    page.click("#tok-0-5")
    assert view.text("#field-role") == "observation" and view.text("#field-turn") == "0"
    page.click("#tok-0-3")
    assert view.text("#field-token_scores") == "0.1000"  # valid_call on the call turn's last token
    page.hover("#tok-0-8")
    assert "turn 1" in view.text("#token-tooltip")
    page.screenshot(path=str(tmp_path / "turns.png"), full_page=True)
    view.check_clean()
