"""The one text-cutting helper (`ania_nb.text`): one meaning of "at most N characters"."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ania_nb.text import ELLIPSIS, cut, flatten

limits = st.integers(min_value=0, max_value=60)
markers = st.one_of(
    st.just(ELLIPSIS),
    st.just(""),
    st.just("\n...(output truncated)"),
    st.text(max_size=12),
    st.builds(lambda word: lambda n: f"\n… {n} more {word}", st.text(max_size=5)),
)


@given(st.text(), limits, markers, st.sampled_from(["start", "end"]))
def test_a_cut_is_never_longer_than_its_limit(text, limit, marker, keep) -> None:
    assert len(cut(text, limit, marker=marker, keep=keep)) <= limit


@given(st.text(), limits, markers, st.sampled_from(["start", "end"]))
def test_a_text_that_fits_comes_back_unchanged(text, limit, marker, keep) -> None:
    if len(text) <= limit:
        assert cut(text, limit, marker=marker, keep=keep) == text


@given(st.text(min_size=1), markers)
def test_limit_zero_gives_nothing(text, marker) -> None:
    assert cut(text, 0, marker=marker) == ""
    assert flatten(text, 0, marker=marker) == ""


@given(st.text(), limits)
def test_a_cut_keeps_a_prefix_and_ends_with_the_marker(text, limit) -> None:
    shown = cut(text, limit)
    if len(text) > limit > 0:
        assert shown.endswith(ELLIPSIS)
        # The whole budget is used, but for white space at the cut.
        assert shown[: -len(ELLIPSIS)] == text[: limit - 1].rstrip()


@given(st.text(), limits)
def test_keeping_the_end_keeps_a_suffix_behind_the_marker(text, limit) -> None:
    shown = cut(text, limit, marker="[…]", keep="end")
    if len(text) > limit >= 3:
        assert shown.startswith("[…]")
        assert shown[3:] == text[len(text) - (limit - 3) :].lstrip()


def test_the_edges() -> None:
    assert cut("abcdef", 6) == "abcdef"
    assert cut("abcdef", 5) == "abcd…"
    assert cut("hello world", 8) == "hello w…"
    assert cut("hello world", 7) == "hello…"  # the space at the cut goes
    assert cut("a   b", 3, marker="", keep="end") == "b"
    assert cut("你好世界", 3) == "你好…"
    assert cut("abcdef", 1) == "…"  # the marker alone still says something was cut
    assert cut("abcdef", 0) == ""
    assert cut("", 0) == ""
    assert cut("abcdef", 3, marker="") == "abc"
    assert cut("abcdef", 2, marker="...") == ".."  # a marker longer than the limit is cut too
    assert cut("abcdef", 4, marker="..", keep="end") == "..ef"
    with pytest.raises(ValueError, match="0 or more"):
        cut("abc", -1)


@given(st.text(min_size=1), st.integers(min_value=0, max_value=200))
def test_a_counting_marker_counts_what_was_left_out(text, limit) -> None:
    shown = cut(text, limit, marker=lambda n: f"|{n} more")
    if len(text) > limit and "|" not in text:
        kept, _, count = shown.partition("|")
        if count.endswith(" more"):  # the note fitted
            assert int(count.removesuffix(" more")) == len(text) - len(kept)


def test_a_counting_marker_settles_where_the_count_gains_a_digit() -> None:
    # 1000 characters into 100: the note's own length decides how many are left out.
    text = "x" * 1000
    shown = cut(text, 100, marker=lambda n: f"\n… {n} more characters")
    kept, _, note = shown.partition("\n")
    assert len(shown) == 100
    assert note == f"… {1000 - len(kept)} more characters"


def test_flatten_puts_text_on_one_line_then_cuts() -> None:
    assert flatten("  a \n\t b  ") == "a b"
    assert flatten("one two three", 7) == "one tw…"
    assert flatten("one two", 7) == "one two"
    assert flatten("one\ntwo three", 8, marker="...") == "one t..."
