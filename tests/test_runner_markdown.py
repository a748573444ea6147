"""Markdown flattened for plain-text chats, and long texts split (`ania_nb.runner.markdown`)."""

from __future__ import annotations

import pytest

from ania_nb.runner.markdown import plain, split
from ania_nb.runner.model import image_url_allowed


def flat(text: str) -> str:
    return plain(text, image_allowed=image_url_allowed).text


def test_emphasis_and_headings_are_dropped_words_kept() -> None:
    assert flat("# Title\n## **Clock** run ##\nSome *light* and __strong__ ~~old~~ text") == (
        "Title\nClock run\nSome light and strong old text"
    )
    assert flat("Report\n======\nbody\n\n---\n\nafter") == "Report\nbody\n\n\nafter".replace(
        "\n\n\n", "\n\n"
    )
    assert flat("***both*** and **a** b **c**") == "both and a b c"


def test_what_only_looks_like_emphasis_stays() -> None:
    assert flat("snake_case_name and 2 * 3 * 4 and a_b_ c") == (
        "snake_case_name and 2 * 3 * 4 and a_b_ c"
    )
    assert flat(r"a \*literal\* star") == "a *literal* star"
    assert flat("see https://example.com/a_b_c/*x* now") == "see https://example.com/a_b_c/*x* now"


def test_cjk_emphasis_touching_letters_is_dropped() -> None:
    assert flat("这是**重点**内容，*斜体*也行。") == "这是重点内容，斜体也行。"
    assert flat("### 今日**总结**") == "今日总结"


def test_nested_lists_stay_lists() -> None:
    text = (
        "- one\n  - two\n    - three\n* star\n+ plus\n"
        "1. first\n2) second\n   - under\n- [ ] todo\n- [x] done"
    )
    assert flat(text) == (
        "• one\n  • two\n    • three\n• star\n• plus\n1. first\n2) second\n  • under\n"
        "☐ todo\n☑ done"
    )


def test_code_fences_keep_their_lines_and_inline_code_loses_its_ticks() -> None:
    text = (
        "Run:\n```python\ndef f(**kw):\n    return [x for x in kw]  # *not* emphasis\n```\n"
        "then `a_b*c*`."
    )
    assert flat(text) == (
        "Run:\ndef f(**kw):\n    return [x for x in kw]  # *not* emphasis\nthen a_b*c*."
    )
    assert flat("~~~\n# not a heading\n~~~") == "# not a heading"
    assert flat("```\nunclosed **fence**") == "unclosed **fence**"


def test_links_become_text_and_url() -> None:
    assert flat("Read [the guide](https://x.org/guide) or <https://x.org>.") == (
        "Read the guide (https://x.org/guide) or https://x.org."
    )
    assert flat("[https://x.org](https://x.org)") == "https://x.org"
    assert flat('[**bold** link](https://x.org/a_b "title")') == "bold link (https://x.org/a_b)"
    assert flat("[文档](https://x.org/zh)里有说明") == "文档 (https://x.org/zh)里有说明"


def test_tables_become_one_line_per_row() -> None:
    text = (
        "| name | **score** |\n|:-----|------:|\n| Ann | 3 |\n| 小明 | `5` |\n\nafter | not a table"
    )
    assert flat(text) == "name | score\nAnn | 3\n小明 | 5\n\nafter | not a table"


def test_quotes_and_blank_lines() -> None:
    assert flat("> quoted *text*\n> - item\n\n\n\nend") == "│ quoted text\n│ • item\n\nend"


def test_images_where_the_url_is_allowed_are_taken_out() -> None:
    result = plain(
        "![cat](https://x.org/cat.png) look ![local](file:///etc/passwd) "
        "![](/tmp/a.png) end ![dog](http://x.org/dog.jpg)",
        image_allowed=image_url_allowed,
    )
    assert result.images == ("https://x.org/cat.png", "http://x.org/dog.jpg")
    assert result.text == "look local (file:///etc/passwd) /tmp/a.png end"
    nothing = plain("![cat](https://x.org/cat.png)")  # default: no URL is allowed
    assert nothing == type(nothing)("cat (https://x.org/cat.png)", ())


def test_image_url_rule_is_the_adapters_rule() -> None:
    assert image_url_allowed("https://a/b.png") and image_url_allowed("data:image/png;base64,AA")
    assert not image_url_allowed("file:///etc/passwd")
    assert not image_url_allowed("/etc/passwd") and not image_url_allowed("base64://AAAA")


def test_split_prefers_paragraphs_then_lines_then_sentences() -> None:
    para = "a" * 50
    assert split(f"{para}\n\n{para}", 80) == [para, para]
    assert split(f"{'b' * 30}\n{'c' * 30}\n\n{'d' * 30}", 70) == [
        f"{'b' * 30}\n{'c' * 30}",
        "d" * 30,
    ]
    lines = "\n".join(["line"] * 30)
    assert all(len(p) <= 40 and not p.startswith("\n") for p in split(lines, 40))
    assert "\n".join(split(lines, 40)) == lines
    sentences = "One two three. Four five six! Seven eight nine? Ten."
    assert split(sentences, 20) == ["One two three.", "Four five six!", "Seven eight nine?", "Ten."]


def test_split_cjk_at_sentence_ends_and_hard_cuts_when_nothing_fits() -> None:
    text = "今天天气很好。" * 20 + "我们出去玩吧！" * 20
    pieces = split(text, 100)
    assert all(len(p) <= 100 and p[-1] in "。！" for p in pieces)
    assert "".join(pieces) == text
    assert split("x" * 250, 100) == ["x" * 100, "x" * 100, "x" * 50]
    assert split("short", 100) == ["short"] and split("  ", 10) == []
    with pytest.raises(ValueError, match="1 or more"):
        split("x", 0)
