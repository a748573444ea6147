"""Pure text helpers of the knowledge base: chunking, dedupe keys, keyword match.

``chunk_text`` follows the original [orig §6.3]: content that fits is one chunk; longer content is
split on lines, lines are accumulated until the next one would not fit, and each new chunk
starts with the last ``overlap`` characters of the previous one; a line longer than a chunk is
cut hard. Every chunk is a contiguous piece of the (newline-normalised) content with its
surrounding whitespace stripped, so ``chunk_spans`` can say where each one comes from; blank
chunks and chunks that only repeat a neighbour's overlap are left out.
"""

from __future__ import annotations

import hashlib
import re

__all__ = [
    "chunk_spans",
    "chunk_text",
    "collapse_ws",
    "dedupe_key",
    "match_share",
    "normalize_newlines",
    "query_terms",
]

# Scripts written without spaces between words: keyword terms are their character bigrams.
_CJK = (
    "\u3040-\u30ff"  # hiragana, katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs (ext. A, unified, compatibility)
    "\uac00-\ud7af"  # hangul syllables
    "\U00020000-\U0002fa1f"  # CJK ideographs ext. B-F, compatibility supplement
)
# A term is a run of CJK characters or a run of other word characters; punctuation separates.
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W{_CJK}]+")
_CJK_RUN = re.compile(rf"[{_CJK}]+")
# Word terms match at a word start only: "api" not inside "rapid".
_NOT_AFTER_WORD = rf"(?<![^\W{_CJK}])"

# English function words match almost any English text; counting them would let every chunk
# pass the auto-inject keyword gate. They are dropped unless the query has nothing else.
_STOPWORDS = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "but", "by", "can", "could", "do", "does", "did",
     "for", "from", "had", "has", "have", "how", "i", "if", "in", "into", "is", "it", "its", "me",
     "my", "of", "on", "or", "our", "so", "that", "the", "their", "them", "there", "these", "they",
     "this", "those", "to", "was", "we", "were", "what", "when", "where", "which", "who", "whom",
     "why", "will", "with", "would", "you", "your"]
)  # fmt: skip


def normalize_newlines(text: str) -> str:
    """``text`` with CRLF and lone CR line ends turned into newlines."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _clamp_overlap(size: int, overlap: int) -> int:
    # An overlap of half a chunk or more would make hard cuts crawl (or, at >= size, never end).
    return max(0, min(overlap, size // 2))


def chunk_spans(text: str, size: int = 600, overlap: int = 60) -> list[tuple[int, int]]:
    """The ``(start, end)`` slices of ``text`` that ``chunk_text`` keeps, in order."""
    if size < 1:
        raise ValueError(f"chunk size must be at least 1 character, got {size}")
    overlap = _clamp_overlap(size, overlap)
    if len(text) <= size:
        stripped = text.lstrip()
        return [(len(text) - len(stripped), len(text.rstrip()))] if stripped else []
    spans: list[tuple[int, int]] = []
    fresh = 0  # text[:fresh] is in an emitted chunk already (or blank)

    def news(a: int, b: int) -> bool:
        # Whether text[a:b] has something no chunk holds yet.
        return bool(text[max(a, fresh) : b].strip())

    def worth(a: int, b: int) -> bool:
        # A chunk text[a:b] followed by one starting at b - overlap: does it add anything? Not if
        # all it has that is new, or all it has that is not carried, is blank.
        return news(a, b) and bool(text[a : max(a, b - overlap)].strip())

    def emit(a: int, b: int) -> None:
        nonlocal fresh
        piece = text[a:b]
        if news(a, b):  # else it would only repeat the previous chunk's tail
            spans.append((a + len(piece) - len(piece.lstrip()), a + len(piece.rstrip())))
        fresh = max(fresh, b)

    start: int | None = None  # the buffer is text[start:end]
    end = 0
    pos = 0
    while pos <= len(text):
        nl = text.find("\n", pos)
        line_end = len(text) if nl < 0 else nl
        if start is None:
            start = pos
        elif line_end - start > size and worth(start, end):
            # buffer + "\n" + line would not fit. A buffer with nothing new outside the tail
            # it would carry is kept instead: as a chunk it would be contained in the next.
            emit(start, end)
            start = end - overlap if overlap else pos
        end = line_end
        while end - start > size:  # too long even alone: cut hard, carrying the overlap
            if worth(start, start + size):
                emit(start, start + size)
            start += size - overlap
        pos = line_end + 1
    if start is not None:
        emit(start, end)
    return spans


def chunk_text(content: str, size: int = 600, overlap: int = 60) -> list[str]:
    """Cut ``content`` into stripped chunks of at most ``size`` characters, none blank."""
    text = normalize_newlines(content)
    return [text[a:b] for a, b in chunk_spans(text, size, overlap)]


def collapse_ws(text: str) -> str:
    """``text`` with runs of whitespace made one space and the ends stripped."""
    return " ".join(text.split())


def dedupe_key(title: str, content: str) -> str:
    """The key under which equal documents (up to whitespace) are one: a sha256 hex digest."""
    key = collapse_ws(title) + "\n" + collapse_ws(content)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def query_terms(text: str) -> list[str]:
    """The keywords of a query, lower-cased, deduplicated, in order ([orig §6.4], see below).

    Like the original's query terms: each field is a term, CJK runs also give their character
    bigrams. Unlike it, punctuation separates fields (so "数据库？" does not yield "库？"),
    words of other scripts are not cut into bigrams ("api" does not become "ap", "pi", "a", …,
    which match nearly any English text), and English function words are dropped when the
    query has other terms.
    """
    terms: dict[str, None] = {}
    for token in _TOKEN.findall(text.lower()):
        terms[token] = None
        if _CJK_RUN.fullmatch(token) and len(token) > 2:
            for i in range(len(token) - 1):
                terms[token[i : i + 2]] = None
    content = [t for t in terms if t not in _STOPWORDS]
    return content or list(terms)


def match_share(query: str, text: str) -> float:
    """The share (0..1) of the query's keywords found in ``text``; 0.0 when it has none.

    CJK terms count anywhere in the text; other words only at the start of a word, so "api"
    counts in "apis" and "api-key" but not in "rapid".
    """
    terms = query_terms(query)
    longer = [t for t in terms if len(t) > 1]
    if longer:  # single characters match almost anything once there is something better
        terms = longer
    if not terms:
        return 0.0
    haystack = text.lower()
    found = sum(1 for t in terms if _found(t, haystack))
    return found / len(terms)


def _found(term: str, haystack: str) -> bool:
    if _CJK_RUN.match(term):
        return term in haystack
    return re.search(_NOT_AFTER_WORD + re.escape(term), haystack) is not None
