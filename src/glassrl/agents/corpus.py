"""Offline ``search`` and ``open_page`` over a small bundled corpus (corpus/README.md).

A page is a JSON file ``corpus/<id>.json`` with id, url, title, kind (official, news,
forecast, rumour), lang, date and text. ``search(query)`` ranks pages by BM25 (Robertson &
Zaragoza 2009, "The Probabilistic Relevance Framework: BM25 and Beyond", eq. 3.15, with
k1 = 1.2, b = 0.75) over title and text; the terms are lower-cased words of letters and digits,
and single Han characters and Han bigrams, so an English or a Chinese query finds its pages.
A result line shows rank, title, url and the start of the text, as a search engine's does; it
does not show ``kind``: telling the official report from the rumour is the agent's job.
``open_page(url)`` returns a page's title, url, date and text; a page id works as well.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from glassrl.errors import GlassrlError

CORPUS_DIR = Path(__file__).with_name("corpus")
FIELDS = ("id", "url", "title", "kind", "lang", "date", "text")
KINDS = ("official", "news", "forecast", "rumour")
K1, B = 1.2, 0.75
_WORD = re.compile(r"[0-9a-z]+(?:\.[0-9]+)?")
_HAN = re.compile(r"[\u4e00-\u9fff]+")


@dataclass(frozen=True)
class Page:
    id: str
    url: str
    title: str
    kind: str
    lang: str
    date: str
    text: str


def terms(text: str) -> list[str]:
    """Lower-cased words and numbers, plus each Han character and each Han bigram."""
    text = text.lower()
    out = _WORD.findall(text)
    for run in _HAN.findall(text):
        out.extend(run)
        out.extend(run[i : i + 2] for i in range(len(run) - 1))
    return out


@lru_cache(maxsize=8)
def load_pages(directory: Path = CORPUS_DIR) -> tuple[Page, ...]:
    """Every ``*.json`` page of ``directory``, sorted by id; GlassrlError naming a bad file."""
    pages = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            row = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise GlassrlError(f"{path}: {err}") from None
        missing = [f for f in FIELDS if not isinstance(row.get(f), str)]
        if missing:
            raise GlassrlError(f"{path}: field {missing[0]!r} missing or not a string")
        if row["id"] != path.stem or row["kind"] not in KINDS:
            raise GlassrlError(f"{path}: id must be the file name and kind one of {', '.join(KINDS)}")
        pages.append(Page(**{f: row[f] for f in FIELDS}))
    if not pages:
        raise GlassrlError(f"{directory}: no *.json pages")
    return tuple(pages)


class Corpus:
    """BM25 search and lookup by url or id over ``pages``."""

    def __init__(self, pages: tuple[Page, ...]) -> None:
        self.pages = pages
        self.by_key = {p.url: p for p in pages} | {p.id: p for p in pages}
        self.counts = [Counter(terms(f"{p.title} {p.text}")) for p in pages]
        self.lengths = [sum(c.values()) for c in self.counts]
        self.mean_length = sum(self.lengths) / len(pages)
        documents = Counter(t for c in self.counts for t in c)
        N = len(pages)
        # BM25's idf with +1 inside the log (Lucene's variant): never negative for common terms.
        self.idf = {t: math.log(1 + (N - n + 0.5) / (n + 0.5)) for t, n in documents.items()}

    def search(self, query: str, k: int = 3) -> list[tuple[Page, float]]:
        """The ``k`` best pages for ``query`` with their BM25 scores, best first; pages scoring 0 are left out."""
        wanted = Counter(terms(query))
        scored = []
        for page, counts, length in zip(self.pages, self.counts, self.lengths):
            norm = K1 * (1 - B + B * length / self.mean_length)
            score = sum(
                q * self.idf[t] * counts[t] * (K1 + 1) / (counts[t] + norm) for t, q in wanted.items() if t in counts
            )
            if score > 0:
                scored.append((page, score))
        scored.sort(key=lambda item: (-item[1], item[0].id))
        return scored[:k]

    def open(self, key: str) -> Page:
        key = key.strip()
        if key not in self.by_key:
            raise ValueError(f"no page at {key!r}; open a url from the search results")
        return self.by_key[key]


@lru_cache(maxsize=1)
def default_corpus() -> Corpus:
    """The bundled corpus, indexed once per process."""
    return Corpus(load_pages())


class SearchTool:
    """``search(query)`` -> numbered results: title, url, and the first ``snippet_chars`` of the text."""

    name = "search"
    description = "Search the web (an offline snapshot). Returns titles, urls and snippets."
    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "keywords"}},
        "required": ["query"],
    }

    def __init__(self, corpus: Corpus | None = None, *, k: int = 3, snippet_chars: int = 80) -> None:
        self.corpus = corpus or default_corpus()
        self.k = k
        self.snippet_chars = snippet_chars

    def found(self, query: str) -> list[Page]:
        """The pages the query finds, best first (BM25)."""
        return [page for page, _ in self.corpus.search(query, self.k)]

    def call(self, arguments: dict[str, Any]) -> str:
        found = self.found(arguments["query"])
        if not found:
            return "no results"
        lines = []
        for rank, page in enumerate(found, 1):
            line = f"{rank}. {page.title} | {page.url}"
            if self.snippet_chars:  # 0: title and url only
                line += f" | {page.text[: self.snippet_chars]}" + ("…" if len(page.text) > self.snippet_chars else "")
            lines.append(line)
        return "\n".join(lines)


class RankedSearchTool(SearchTool):
    """``search`` over a corpus whose pages are listed in a search engine's order (a snapshot of
    its ranking): the pages the query finds (BM25 score > 0), in that order, at most ``k``."""

    def found(self, query: str) -> list[Page]:
        hits = {page.id for page, _ in self.corpus.search(query, len(self.corpus.pages))}
        return [page for page in self.corpus.pages if page.id in hits][: self.k]


class OpenPageTool:
    """``open_page(url)`` -> the page's title, url and date (unless ``url_line`` is False), and text
    (at most ``max_chars`` of it)."""

    name = "open_page"
    description = "Open a web page by its url (from the search results) and read its text."
    parameters = {
        "type": "object",
        "properties": {"url": {"type": "string", "description": "a url from the search results"}},
        "required": ["url"],
    }

    def __init__(self, corpus: Corpus | None = None, *, max_chars: int = 2000, url_line: bool = True) -> None:
        self.corpus = corpus or default_corpus()
        self.max_chars = max_chars
        self.url_line = url_line

    def call(self, arguments: dict[str, Any]) -> str:
        page = self.corpus.open(arguments["url"])
        where = f"{page.url} ({page.date})\n" if self.url_line else ""
        return f"{page.title}\n{where}{page.text[: self.max_chars]}"
