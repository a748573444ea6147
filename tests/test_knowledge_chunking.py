"""Chunking, dedupe keys and keyword match of the knowledge base (pure functions)."""

from __future__ import annotations

import hashlib
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ania_nb.knowledge.chunking import (
    chunk_spans,
    chunk_text,
    collapse_ws,
    dedupe_key,
    match_share,
    normalize_newlines,
    query_terms,
)

# Text made of a few characters, newlines and spaces, so lines, blank runs and hard cuts all occur.
_texts = st.text(alphabet=st.sampled_from("ab中文 \n\t\r"), max_size=900) | st.builds(
    "\n".join, st.lists(st.text(alphabet="xy 字", max_size=250), max_size=12)
)


def _check_spans(text: str, size: int, overlap: int) -> list[tuple[int, int]]:
    spans = chunk_spans(text, size, overlap)
    carry = max(0, min(overlap, size // 2))
    for a, b in spans:
        assert 0 <= a < b <= len(text)
        assert b - a <= size
        assert text[a:b].strip() == text[a:b] != "", "a blank or unstripped chunk"
    for (a1, b1), (a2, b2) in itertools.pairwise(spans):
        assert a2 > a1 and b2 > b1, "each chunk moves on (none contained in the next)"
        assert a2 >= b1 - carry, "chunks overlap by at most the overlap"
    covered = set()
    for a, b in spans:
        covered.update(range(a, b))
    missing = [i for i, ch in enumerate(text) if not ch.isspace() and i not in covered]
    assert not missing, f"characters not in any chunk at {missing[:5]}"
    return spans


@st.composite
def _lines_around_size(draw: st.DrawFn) -> tuple[str, int, int]:
    # Lines from empty to three chunks long: short lines before long ones, carries, hard cuts.
    size = draw(st.integers(4, 80))
    overlap = draw(st.integers(0, size))
    lengths = draw(st.lists(st.integers(0, 3 * size), min_size=1, max_size=10))
    fill = draw(st.sampled_from(["k", "字", " ", "k k"]))
    lines = [(fill * n)[:n] for n in lengths]
    return "\n".join(lines), size, overlap


@settings(max_examples=300, deadline=None)
@given(case=_lines_around_size())
def test_chunk_invariants_hold_for_lines_around_the_size(case: tuple[str, int, int]) -> None:
    text, size, overlap = case
    spans = _check_spans(text, size, overlap)
    assert chunk_text(text, size, overlap) == [text[a:b] for a, b in spans]


@settings(max_examples=300, deadline=None)
@given(text=_texts, size=st.integers(1, 120), overlap=st.integers(-5, 200))
def test_chunk_invariants_hold_for_any_text(text: str, size: int, overlap: int) -> None:
    normal = normalize_newlines(text)
    spans = _check_spans(normal, size, overlap)
    chunks = chunk_text(text, size, overlap)
    assert chunks == [normal[a:b] for a, b in spans]
    assert all("\r" not in c for c in chunks)
    if len(normal) <= size:
        assert chunks == ([normal.strip()] if normal.strip() else [])


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.text(alphabet="ab 中", min_size=1, max_size=40), min_size=1, max_size=60),
    size=st.integers(60, 200),
)
def test_lines_that_fit_are_never_cut(lines: list[str], size: int) -> None:
    # Lines shorter than a chunk minus the carried tail: every chunk ends at a line end.
    text = "\n".join(lines)
    spans = _check_spans(text, size, 10)
    for _, b in spans:
        assert not text[b:].split("\n", 1)[0].strip(), "a chunk ends inside a line"


def test_empty_and_blank_content_give_no_chunks() -> None:
    assert chunk_text("") == []
    assert chunk_text("   \n\t ") == []
    assert chunk_text(" \n" * 1000) == []  # longer than a chunk and still blank


def test_content_of_exactly_size_is_one_chunk_and_one_more_is_two() -> None:
    assert chunk_text("a" * 600) == ["a" * 600]
    chunks = chunk_text("a" * 601)
    assert [len(c) for c in chunks] == [600, 61]  # the second: 60 carried + 1 new


def test_chunks_are_stripped() -> None:
    assert chunk_text("  hello\n\nworld  ") == ["hello\n\nworld"]
    assert chunk_text("\n\n" + "u" * 400 + " \n" + "v" * 400 + "\n") == [
        "u" * 400,
        "u" * 59 + " \n" + "v" * 400,
    ]


def test_lines_accumulate_and_the_next_chunk_starts_with_the_overlap() -> None:
    lines = [f"{i:03d}" + "x" * 96 for i in range(12)]  # 12 lines of 99 chars
    chunks = chunk_text("\n".join(lines), 600, 60)
    # 6 lines make 6*99+5 = 599 chars; a 7th would not fit.
    assert chunks[0] == "\n".join(lines[:6])
    assert chunks[1] == chunks[0][-60:] + "\n" + "\n".join(lines[6:11])
    assert chunks[2] == chunks[1][-60:] + "\n" + lines[11]
    assert len(chunks) == 3


def test_a_line_longer_than_size_is_cut_hard_with_overlap() -> None:
    text = "short\n" + "b" * 1500 + "\nend"
    chunks = chunk_text(text, 600, 60)
    assert all(len(c) <= 600 for c in chunks)
    # "short" (within the overlap) is not a chunk on its own: it opens the hard-cut run.
    assert chunks[0] == "short\n" + "b" * 594
    assert chunks[1] == chunks[0][-60:] + "b" * 540
    assert chunks[-1].endswith("b\nend")
    assert "".join(c[60:] if i else c for i, c in enumerate(chunks)) == text


def test_cjk_text_without_newlines_is_cut_into_full_chunks() -> None:
    text = "知识库把文档切成片段，" * 150  # 1650 characters, no newline
    chunks = chunk_text(text, 600, 60)
    assert [len(c) for c in chunks] == [600, 600, 570]
    assert chunks[1].startswith(chunks[0][-60:])
    assert chunks[0] + chunks[1][60:] + chunks[2][60:] == text


@pytest.mark.parametrize("overlap", [300, 600, 601, 10_000])
def test_overlap_at_or_above_half_the_size_is_clamped(overlap: int) -> None:
    chunks = chunk_text("z" * 1000, 100, overlap)
    assert all(len(c) == 100 for c in chunks[:-1])
    # clamped to 50: a new chunk every 50 characters
    assert len(chunks) == 19
    assert chunks[1] == "z" * 100


def test_negative_overlap_means_none_and_zero_overlap_repeats_nothing() -> None:
    text = "\n".join(["p" * 70, "q" * 70, "r" * 70])
    assert chunk_text(text, 100, -3) == chunk_text(text, 100, 0) == ["p" * 70, "q" * 70, "r" * 70]


def test_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="chunk size"):
        chunk_text("abc", 0)


def test_crlf_and_lone_cr_are_line_ends() -> None:
    text = "x" * 400 + "\r\n" + "y" * 400 + "\r" + "w" * 10
    chunks = chunk_text(text, 600, 60)
    assert chunks == ["x" * 400, "x" * 60 + "\n" + "y" * 400 + "\n" + "w" * 10]
    assert chunk_text("a\r\nb") == ["a\nb"]


def test_a_trailing_run_of_blank_lines_gives_no_extra_chunk() -> None:
    text = "m" * 599 + "\n" + "\n \n" * 300
    assert chunk_text(text, 600, 60) == ["m" * 599]


def test_collapse_ws() -> None:
    assert collapse_ws("  a \t b\n\n c  ") == "a b c"
    assert collapse_ws("\u3000中\u00a0文 ") == "中 文"
    assert collapse_ws(" \n ") == ""


def test_dedupe_key_ignores_whitespace_but_not_case_or_the_title_boundary() -> None:
    key = dedupe_key(" Title ", "some  text\n\nhere")
    assert key == hashlib.sha256(b"Title\nsome text here").hexdigest()
    assert key == dedupe_key("Title", "some text here")
    assert key != dedupe_key("title", "some text here")
    assert dedupe_key("a b", "c") != dedupe_key("a", "b c")


def test_query_terms() -> None:
    assert query_terms("向量数据库") == ["向量数据库", "向量", "量数", "数据", "据库"]
    assert query_terms("猫") == ["猫"]
    assert query_terms("数据") == ["数据"]
    # punctuation separates; function words go; words are not cut into bigrams
    assert query_terms("What is the LanceDB API?") == ["lancedb", "api"]
    assert query_terms("什么是RAG，怎么用？") == [
        "什么是",
        "什么",
        "么是",
        "rag",
        "怎么用",
        "怎么",
        "么用",
    ]
    assert query_terms("node.js gpt-4o") == ["node", "js", "gpt", "4o"]
    assert query_terms("the the") == ["the"]  # nothing but function words: kept
    assert query_terms("  ？！ ") == []


def test_match_share() -> None:
    assert match_share("向量数据库", "LanceDB 是一个向量数据库") == 1.0
    assert match_share("向量数据库", "数据库") == pytest.approx(2 / 5)
    assert match_share("lancedb api", "The LanceDB APIs") == 1.0  # at a word start
    assert match_share("api", "rapid apple pie") == 0.0  # not inside a word, no bigrams
    assert match_share("a api", "a b c") == 0.0  # "a" is ignored next to "api"
    assert match_share("a", "a b c") == 1.0
    assert match_share("C 语言", "c 是一门语言") == 1.0
    assert match_share("gpt4", "用gpt4模型") == 1.0  # CJK before a word is a word start
    assert match_share("", "anything") == 0.0
    assert match_share("？", "？") == 0.0
    assert match_share("how to index vectors", "Build an index over the vectors") == 1.0
    assert match_share("how to index vectors", "An unrelated English text about cooking") == 0.0
