"""The research task: the reference dialogue's agentic question, as episodes generated from seeds.

dialogue-agentic-rl-rubric-reward.md, part 1: it is May 2025; the user asks for a summary of
Google's 2025 results with a focus on Cloud revenue. Only the first quarter is reported. The
agent searches, sees an official release, a rumour ("5 trillion for the full year") and an
analyst forecast, opens one page (the decision step, t = 4), and writes a report that a weighted
rubric scores (accuracy 1 + temporal correctness 1 + citation 0.5 = 2.5).

Here that story is a family of episodes (:class:`Episode`), so that no answer can be memorised:

- a fictional **company** (``COMPANIES``: names of three syllables; a seeded hash puts ``TEST_FRACTION`` of
  them in the test split, so held-out episodes ask about companies no train episode names), a
  **product line**, the **year** asked for and the date **today**: the latest release is the
  ``quarter``-th quarter's (1-3: the year is not yet reported) or the full year's (4: "today" is
  after the annual release);
- a **corpus of four pages** (:func:`pages`), in the question's language (Chinese or English):
  the official release with the true figure on the company's own site, a rumour page with an
  inflated "full-year" claim in trillions, an analyst forecast labelled as an estimate, and a news
  page that cites the official release; the search engine's ranking of them is seeded too;
- the hidden facts (the figure, the forecast, the rumour, the ranking, the sites) are drawn from
  a generator seeded by the visible ones (company, product, year, today, language, phrasing), so
  a typed prompt of the task's form has one episode (:func:`record_for_prompt`) and
  ``glassrl explain --prompt`` can replay it.

The rubric (the dialogue's, part 2), judged by rules on the final report (``CRITERIA``; each
scores 0 or 1; R = Σ w_i·s_i, at most 2.5):

- accuracy (w = 1.0): states the official figure ($4.2 billion, 42 亿);
- temporal (w = 1.0), a negative constraint: names the reported period (the quarter, or the full
  year once reported); states no rumour figure (trillions); any sentence that gives a number
  about the full year before it is reported, or the analysts' forecast, says it is a forecast
  or not yet reported (``HEDGES``);
- citation (w = 0.5): cites the official release with ``\\cite{…}`` (its url or page id).

:data:`DIALOGUE` is the dialogue's own episode (Google, Cloud, Q1 2025, $11.5 billion, forecast
$50 billion, rumour 5 trillion); it is not drawn into any split. :func:`scripted_turns` writes a
scripted agent's turns (the official path scores 2.5, the rumour path 0); the research-agent
model's SFT transcripts are made from them (glassrl.builtin.research_model).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import re
import zlib
from dataclasses import dataclass
from typing import Any

from glassrl.data.records import PromptRecord

NAME = "research"
TOOLS = ("search", "open_page")
TEST_FRACTION = 0.2
LANGUAGES = ("zh", "en")
PRODUCTS = ("Cloud", "Ads", "Devices", "Search", "Games", "Payments", "Maps", "Music")
YEARS = (2022, 2023, 2024, 2025, 2026)
# Company names of three syllables, 3,375 of them: each is rare in any split, so a tokenizer learns
# the syllables rather than whole names, and a held-out name is new syllables' order, not new tokens.
_HEADS = ("Nim", "Vor", "Qua", "Zel", "Tri", "Lum", "Kor", "Bex", "Sol", "Tal", "Mer", "Dra", "Fen", "Hal", "Jov")
_MIDDLES = ("a", "e", "i", "o", "u", "ar", "en", "il", "or", "un", "ax", "et", "im", "os", "ul")
_TAILS = ("bus", "tex", "ra", "ium", "ix", "on", "ca", "ent", "ly", "va", "nt", "ro", "is", "um", "ax")
COMPANIES = tuple(h + m + t for h in _HEADS for m in _MIDDLES for t in _TAILS)
RUMOUR_SITES = ("tech-gossip.com", "market-buzz.net", "keji-bagua.cn")
FORECAST_SITES = ("finance.yahoo.com", "marketwatch.com")
NEWS_SITES = ("news.example.com", "caijing.example.cn")
KINDS = ("official", "rumour", "forecast", "news")
# Release dates: the quarter's results come out in the month after it ends; the full year's in February.
_RELEASE = {1: (4, 24), 2: (7, 24), 3: (10, 23), 4: (2, 4)}
_ORDINAL_EN = {1: "First", 2: "Second", 3: "Third", 4: "Fourth"}
_ORDINAL_ZH = {1: "一", 2: "二", 3: "三", 4: "四"}

# (language, phrasing) of the user's question; the fields are the episode's.
QUESTIONS = {
    "zh": (
        "今天是{today}。帮我总结 {company} {year}年的财报，重点关注 {product} 业务的营收。用 \\cite{{网址}} 标注来源。",
        "现在是{today}。{company} {product} 业务{year}年的营收是多少？请写一份简短报告，用 \\cite{{网址}} 注明来源。",
        "今天是{today}。请调研 {company} {year}年的财务表现，尤其是 {product} 的收入，用 \\cite{{网址}} 引用可靠来源。",
    ),
    "en": (
        "Today is {today}. Summarise {company}'s {year} results, focusing on {product} revenue. Cite as \\cite{{url}}.",
        "It is {today}. How much revenue did {company} {product} make in {year}? "
        "Write a short report; cite as \\cite{{url}}.",
        "Today is {today}. Research {company}'s {year} earnings, especially {product} revenue; cite as \\cite{{url}}.",
    ),
}


@dataclass(frozen=True)
class Episode:
    """One research question and its world (module docstring). Figures are in billions of dollars."""

    company: str
    product: str
    year: int
    today: str  # ISO date
    lang: str  # "zh" or "en": the question's and the pages' language
    phrasing: int  # index into QUESTIONS[lang]
    domain: str  # the company's own site, where its official releases are
    quarter: int  # the latest reported period: 1-3 a quarter, 4 the full year
    figure: float  # the official revenue of the product in that period
    forecast: float  # the analysts' full-year estimate
    rumour: int  # the rumour's full-year claim, in trillions
    rumour_site: str
    forecast_site: str
    news_site: str
    order: tuple[str, ...]  # the search engine's ranking of the page kinds

    @property
    def full_year(self) -> bool:
        return self.quarter == 4

    @property
    def slug(self) -> str:
        return self.domain.split(".")[0]

    @property
    def official_id(self) -> str:
        return f"{self.slug}-{self.year}-{'fy' if self.full_year else f'q{self.quarter}'}"

    @property
    def official_url(self) -> str:
        return f"https://{self.domain}/investor/{self.official_id.removeprefix(self.slug + '-')}.pdf"

    def url(self, kind: str) -> str:
        return next(p["url"] for p in pages(self) if p["kind"] == kind)


def _today(year: int, quarter: int, rng: random.Random) -> dt.date:
    """A date after the latest release (of ``quarter``, 4 = the full year) and before the next one."""
    month, day = _RELEASE[quarter]
    released = dt.date(year + (quarter == 4), month, day)
    nxt_month, nxt_day = _RELEASE[1] if quarter == 4 else _RELEASE[quarter + 1]
    if quarter == 3:
        nxt = dt.date(year + 1, *_RELEASE[4])
    else:
        nxt = dt.date(year + (quarter == 4), nxt_month, nxt_day)
    return released + dt.timedelta(days=rng.randrange(1, (nxt - released).days))


def make_episode(company: str, product: str, year: int, today: str, lang: str, phrasing: int) -> Episode:
    """The episode of these visible parameters: its hidden facts are drawn from a generator seeded by them."""
    rng = random.Random(f"glassrl-research/{company}/{product}/{year}/{today}/{lang}/{phrasing}")
    date = dt.date.fromisoformat(today)
    quarter = reported_quarter(year, date)
    # Whole billions of two digits: one token to copy for the research agent's tokenizer.
    quarterly = float(rng.randrange(10, 23))  # $10-22 billion a quarter
    figure = float(round(quarterly * (4 + rng.randrange(-3, 4) / 10))) if quarter == 4 else quarterly  # 37-95
    forecast = float(round(quarterly * (4 + rng.randrange(1, 6) / 10)))  # the analysts expect growth: 41-99
    order = list(KINDS)
    rng.shuffle(order)
    return Episode(
        company=company,
        product=product,
        year=year,
        today=today,
        lang=lang,
        phrasing=phrasing,
        domain=f"{company.lower()}.com",
        quarter=quarter,
        figure=figure,
        forecast=forecast if forecast != figure else forecast + 1,
        rumour=rng.choice((2, 3, 5, 8)),
        rumour_site=rng.choice(RUMOUR_SITES),
        forecast_site=rng.choice(FORECAST_SITES),
        news_site=rng.choice(NEWS_SITES),
        order=tuple(order),
    )


def reported_quarter(year: int, today: dt.date) -> int:
    """The latest period of ``year`` reported by ``today``: 1-3 a quarter, 4 the full year; 0 none."""
    if today >= dt.date(year + 1, *_RELEASE[4]):
        return 4
    return sum(today >= dt.date(year, *_RELEASE[q]) for q in (1, 2, 3))


# The dialogue's episode (part 1): asked on 15 May 2025; the Q1 release on abc.xyz, $11.5 billion.
DIALOGUE = Episode(
    company="Google",
    product="Cloud",
    year=2025,
    today="2025-05-15",
    lang="zh",
    phrasing=0,
    domain="abc.xyz",
    quarter=1,
    figure=11.5,
    forecast=50.0,
    rumour=5,
    rumour_site="tech-gossip.com",
    forecast_site="finance.yahoo.com",
    news_site="news.example.com",
    order=("official", "rumour", "forecast", "news"),
)


def split_of(company: str, seed: int = 0) -> str:
    """ "test" for a seeded ``TEST_FRACTION`` of the companies, "train" for the rest."""
    return "test" if zlib.crc32(f"{NAME}/{seed}/{company}".encode()) % 1000 < TEST_FRACTION * 1000 else "train"


def draw_episode(rng: random.Random, companies: list[str]) -> Episode:
    """An episode of one of ``companies``: the latest report is a quarter's 3 times in 4, else the year's."""
    year = rng.choice(YEARS)
    quarter = rng.choice((1, 2, 3, 4))
    today = _today(year, quarter, rng).isoformat()
    lang = rng.choice(LANGUAGES)
    phrasing = rng.randrange(len(QUESTIONS[lang]))
    return make_episode(rng.choice(companies), rng.choice(PRODUCTS), year, today, lang, phrasing)


def episodes(split: str, seed: int, size: int) -> list[Episode]:
    """``size`` distinct episodes of ``split``'s companies, drawn from a generator seeded by (split, seed)."""
    rng = random.Random(f"glassrl-task/{NAME}/{split}/{seed}")
    companies = [c for c in COMPANIES if split_of(c, seed) == split]
    seen: set[Episode] = set()
    out = []
    while len(out) < size:
        episode = draw_episode(rng, companies)
        if episode not in seen:
            seen.add(episode)
            out.append(episode)
    return out


# ---------------------------------------------------------------- texts


def money(billions: float, lang: str) -> str:
    """$27 billion, $11.5 billion; 270亿美元, 115亿美元 (one 亿 is 0.1 billion)."""
    return f"{round(billions * 10)}亿美元" if lang == "zh" else f"${billions:g} billion"


def period(episode: Episode) -> str:
    """The reported period in words: "Q1 2025", "the full year 2025"; "2025年第一季度", "2025年全年"."""
    e = episode
    if e.lang == "zh":
        return f"{e.year}年全年" if e.full_year else f"{e.year}年第{_ORDINAL_ZH[e.quarter]}季度"
    return f"the full year {e.year}" if e.full_year else f"Q{e.quarter} {e.year}"


def today_text(episode: Episode) -> str:
    date = dt.date.fromisoformat(episode.today)
    return f"{date.year}年{date.month}月{date.day}日" if episode.lang == "zh" else f"{date:%B} {date.day}, {date.year}"


def question(episode: Episode) -> str:
    e = episode
    template = QUESTIONS[e.lang][e.phrasing]
    return template.format(today=today_text(e), company=e.company, year=e.year, product=e.product)


def pages(episode: Episode) -> list[dict[str, str]]:
    """The episode's four pages, in the search engine's order: id, url, title, kind, lang, date, text
    (the fields of glassrl.agents.corpus.Page)."""
    e = episode
    c, p, y, k = e.company, e.product, e.year, e.quarter
    released = dt.date(y + e.full_year, *_RELEASE[k]).isoformat()
    fig, fc, when = money(e.figure, e.lang), money(e.forecast, e.lang), period(e)
    tail = e.official_id.removeprefix(e.slug + "-")
    if e.lang == "zh":
        titles = {
            "official": f"{c} 公布{y}年全年业绩" if e.full_year else f"{c} 公布{when}业绩",
            "rumour": f"{c} {y}年营收将破{e.rumour}万亿美元！",
            "forecast": f"分析师预计 {c} {p} 将增长",
            "news": f"{c} {p} 营收增长",
        }
        texts = {
            "official": f"{c} {when} {p} 营收为{fig}。",
            "rumour": f"知情人士称，{c} {y}年全年营收将达{e.rumour}万亿美元！",
            "forecast": f"分析师预计 {c} {y}年全年 {p} 营收为{fc}（预测）。",
            "news": f"{c} 称，{when} {p} 营收为{fig}，见其公告 {e.official_url}。",
        }
    else:
        titles = {
            "official": f"{c} Announces "
            + (f"Fourth Quarter and Fiscal Year {y}" if e.full_year else f"{_ORDINAL_EN[k]} Quarter {y}")
            + " Results",
            "rumour": f"{c} {y} revenue to hit {e.rumour} trillion dollars!",
            "forecast": f"Analysts expect {c} {p} to grow",
            "news": f"{c} {p} revenue rises, company says",
        }
        texts = {
            "official": f"{c} {p} revenue was {fig} in {when}.",
            "rumour": f"Insiders say {c} will make {e.rumour} trillion dollars in the full year {y}!",
            "forecast": f"Analysts estimate {c} {p} revenue of {fc} for the full year {y} (forecast).",
            "news": f"{c} said {p} revenue was {fig} in {when}, according to its release {e.official_url}.",
        }
    where = {
        "official": (e.official_id, e.official_url, released),
        "rumour": (f"rumour-{e.slug}-{y}", f"https://{e.rumour_site}/{e.slug}-{e.rumour}-trillion", e.today),
        "forecast": (f"forecast-{e.slug}-{y}", f"https://{e.forecast_site}/{e.slug}-forecast", e.today),
        "news": (f"news-{e.slug}-{tail}", f"https://{e.news_site}/{e.slug}-{tail}", released),
    }
    return [
        {
            "id": where[kind][0],
            "url": where[kind][1],
            "title": titles[kind],
            "kind": kind,
            "lang": e.lang,
            "date": where[kind][2],
            "text": texts[kind],
        }
        for kind in e.order
    ]


def search_query(episode: Episode) -> str:
    """The query a careful agent searches with (the dialogue's t = 2): company, year, product, revenue."""
    e = episode
    return f"{e.company} {e.year}年 {e.product} 营收" if e.lang == "zh" else f"{e.company} {e.year} {e.product} revenue"


# A scripted agent's report after opening one page (glassrl.builtin.research_model's SFT transcripts):
# the official release, cited and hedged (2.5); the same without the citation (2.0); the rumour's
# full-year claim (0); the analysts' forecast stated as the year's revenue (0).
BEHAVIOURS = ("official", "no_cite", "rumour", "forecast")
OPENS = {"official": "official", "no_cite": "official", "rumour": "rumour", "forecast": "forecast"}


def report(episode: Episode, behaviour: str = "official") -> str:
    """The final report of a scripted agent that behaves as ``behaviour`` (``BEHAVIOURS``)."""
    e = episode
    fig, fc, when = money(e.figure, e.lang), money(e.forecast, e.lang), period(e)
    cite = f" \\cite{{{e.url(OPENS[behaviour])}}}" if behaviour != "no_cite" else ""
    if e.lang == "zh":
        if behaviour == "rumour":
            return f"{e.company} {e.year}年全年营收将达{e.rumour}万亿美元{cite}。"
        if behaviour == "forecast":
            return f"{e.company} {e.year}年 {e.product} 营收为{fc}{cite}。"
        text = f"{e.company} {when} {e.product} 营收为{fig}{cite}。"  # the official page's sentence, cited
        return text if e.full_year else f"{text}全年财报尚未发布。"
    if behaviour == "rumour":
        return f"{e.company} {e.year} revenue will hit {e.rumour} trillion dollars in the full year{cite}."
    if behaviour == "forecast":
        return f"{e.company} {e.product} revenue in {e.year} was {fc}{cite}."
    text = f"{e.company} {e.product} revenue was {fig} in {when}{cite}."  # the official page's sentence, cited
    return text if e.full_year else f"{text} Full-year results are not out yet."


# ---------------------------------------------------------------- the rubric

_RUMOUR = re.compile(r"\d\s*(?:trillion|万亿|tn\b)|\d,?000\s*billion", re.I)
_FULL_YEAR = r"full[- ]year|whole year|fiscal year|\bFY\b|全年"
# Words that mark a figure as not a reported fact.
HEDGES = re.compile(
    r"not (?:yet )?(?:been )?(?:reported|released|published|out)|forecast|expect|estimate|predict|rumou?r|"
    r"unverified|尚未|还未|未发布|未公布|没有公布|预测|预期|预计|估计|传言|谣言",
    re.I,
)
_NUMBER = re.compile(r"\d")
_SENTENCES = re.compile(r"(?<=[.!?。！？；;\n])\s*")
_CITE = re.compile(r"\\cite\{([^}]*)\}")


def _figure(billions: float) -> str:
    """A regex of a figure in either language's form: $4.2 billion, 4.2bn, 4.2B, 42亿, 42 亿."""
    tenths = round(billions * 10)
    number = re.escape(f"{billions:.1f}").replace(r"\.0", r"(?:\.0)?")  # $50 billion is $50.0 billion
    return rf"(?<![\d.]){number}\s*(?:billion|bn|b\b)|(?<![\d.]){tenths}\s*亿"


def _period(episode: Episode) -> re.Pattern[str]:
    """The reported period named: the quarter (Q1, first quarter, 第一季度, 一季度), or the full year."""
    k = episode.quarter
    if episode.full_year:
        return re.compile(_FULL_YEAR, re.I)
    ordinal = _ORDINAL_EN[k].lower()
    return re.compile(rf"\bQ{k}\b|\b{ordinal}[- ]quarter|{_ORDINAL_ZH[k]}季度|第{k}季度", re.I)


def accuracy(report: str, episode: Episode) -> float:
    """准确性: states the official figure ($4.2 billion, 42 亿)."""
    return float(bool(re.search(_figure(episode.figure), report, re.I)))


def temporal(report: str, episode: Episode) -> float:
    """时间正确性: names the reported period; states no rumour figure; every sentence that gives a
    number about the full year before it is reported, or the forecast figure, says it is not a
    reported fact. Citation keys are not read (an official url holds "q1")."""
    report = _CITE.sub("", report)
    if not _period(episode).search(report) or _RUMOUR.search(report):
        return 0.0
    unreported = _figure(episode.forecast) + ("" if episode.full_year else f"|{_FULL_YEAR}")
    for sentence in _SENTENCES.split(report):
        if re.search(unreported, sentence, re.I) and _NUMBER.search(sentence) and not HEDGES.search(sentence):
            return 0.0
    return 1.0


def citation(report: str, episode: Episode) -> float:
    """引用规范: cites the official release, ``\\cite{url}`` or ``\\cite{page id}``."""
    keys = {key.strip() for cited in _CITE.findall(report) for key in cited.split(",")}
    return float(bool(keys & {episode.official_url, episode.official_id}))


# (name, weight w_i, rule scoring the final report of an episode in {0, 1})
CRITERIA = (("accuracy", 1.0, accuracy), ("temporal", 1.0, temporal), ("citation", 0.5, citation))
FULL_MARKS = sum(weight for _, weight, _ in CRITERIA)  # 2.5


def grade(report: str, episode: Episode) -> dict[str, float]:
    """Each criterion's score s_i of a report."""
    return {name: rule(report, episode) for name, _, rule in CRITERIA}


def score(report: str, episode: Episode) -> float:
    """Σ_i w_i · s_i (at most 2.5)."""
    scores = grade(report, episode)
    return sum(weight * scores[name] for name, weight, _ in CRITERIA)


# ---------------------------------------------------------------- records


def record(episode: Episode, source: str) -> PromptRecord:
    """The episode as a record: the question, the official report as the reference answer, and the
    episode itself in ``metadata["episode"]`` (the environment builds its pages from it)."""
    metadata = {
        "task": NAME,
        "lang": episode.lang,
        "tools": list(TOOLS),
        "company": episode.company,
        "reported": "full year" if episode.full_year else f"Q{episode.quarter}",
        "episode": {**dataclasses.asdict(episode), "order": list(episode.order)},
    }
    return PromptRecord(question(episode), report(episode), metadata, source)


def episode_of(record: PromptRecord) -> Episode:
    """The episode a record of this task holds (``record(...)``'s metadata)."""
    fields: dict[str, Any] = dict(record.metadata["episode"])
    return Episode(**{**fields, "order": tuple(fields["order"])})


def records(split: str, seed: int, size: int) -> list[PromptRecord]:
    """``size`` records of distinct episodes of ``split``'s companies (:func:`episodes`)."""
    return [record(e, f"task:{NAME}/{split}#{i}") for i, e in enumerate(episodes(split, seed, size))]


def _question_pattern(template: str, lang: str) -> re.Pattern[str]:
    today = r"(?P<today>\d{4}年\d{1,2}月\d{1,2}日)" if lang == "zh" else r"(?P<today>[A-Z][a-z]+ \d{1,2}, \d{4})"
    fields = {
        "today": today,
        "company": r"(?P<company>[A-Za-z][A-Za-z0-9]*)",
        "year": r"(?P<year>\d{4})",
        "product": r"(?P<product>[A-Za-z]+)",
    }
    parts = re.split(r"(\{today\}|\{company\}|\{year\}|\{product\})", template.replace("{{", "{").replace("}}", "}"))
    return re.compile("".join(fields[p[1:-1]] if p[1:-1] in fields else re.escape(p) for p in parts))


_PATTERNS = [(lang, i, _question_pattern(t, lang)) for lang, ts in QUESTIONS.items() for i, t in enumerate(ts)]


def record_for_prompt(text: str) -> PromptRecord | None:
    """The record of a typed question in one of the task's phrasings (any company, product and year
    for which something is reported by "today"): its hidden facts are the ones ``records`` would
    draw for the same visible parameters. None for any other text."""
    for lang, phrasing, pattern in _PATTERNS:
        if m := pattern.fullmatch(text):
            try:
                raw = m["today"]
                if lang == "zh":
                    y, mo, d = map(int, re.findall(r"\d+", raw))
                    date = dt.date(y, mo, d)
                else:
                    date = dt.datetime.strptime(raw, "%B %d, %Y").date()
            except ValueError:
                return None
            if reported_quarter(int(m["year"]), date) == 0:
                return None
            episode = make_episode(m["company"], m["product"], int(m["year"]), date.isoformat(), lang, phrasing)
            if question(episode) != text:
                return None
            return record(episode, repr(text))
    return None
