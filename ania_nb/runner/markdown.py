"""Chat text for plain-text platforms: Markdown flattened, long texts split.

QQ shows a message as written, so a model's Markdown arrives raw (``⏰ **Clock run** …``).
`plain` turns it into text that reads well there (``runner.markdown = "plain"``):

* emphasis (``**b**``, ``*i*``, ``__b__``, ``_i_``, ``~~s~~``) and heading marks are dropped,
  the words kept; a horizontal rule becomes a blank line;
* lists stay lists: ``- x`` / ``* x`` / ``+ x`` become ``• x`` (nested ones indented two spaces
  per level), task items ``☐``/``☑``, numbered items stay numbered;
* code stays readable: a fenced block's lines are kept exactly (the fences go), inline code
  loses its backticks and nothing inside code is touched;
* links become ``text (url)`` (just the url when the text is the url), ``<url>`` the url;
* a table becomes one line per row, cells joined by ``" | "``, its rule line dropped;
* a quote's ``>`` becomes ``│``;
* an image ``![alt](url)`` whose URL the platform may fetch (`image_url_allowed`) is taken out
  of the text and sent as an image; any other is written like a link.

`split` cuts a text longer than the platform's message limit at the best boundary inside the
limit: a blank line, else a line end, else a sentence end (``。！？.!?``), else a space, else
anywhere. Pure functions, standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["PlainText", "plain", "split"]


@dataclass(frozen=True)
class PlainText:
    """Flattened text and the images taken out of it (in order of appearance)."""

    text: str
    images: tuple[str, ...] = ()


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^ {0,3}#{1,6}(?:\s+|$)(.*?)(?:\s+#+\s*)?$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)\s*$")
_RULE = re.compile(r"^ {0,3}([-*_])(?:\s*\1){2,}\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(?:\[([ xX])\]\s+)?(.*)$")
_ORDERED = re.compile(r"^(\s*)(\d{1,9})([.)])\s+(.*)$")
_QUOTE = re.compile(r"^ {0,3}>\s?(.*)$")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_IMAGE = re.compile(r"!\[([^\]]*)\]\(\s*<?([^\s)>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_LINK = re.compile(r"\[([^\]]+)\]\(\s*<?([^\s)>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_AUTOLINK = re.compile(r"<((?:https?|mailto|ftp):[^\s>]+)>")
_BARE_URL = re.compile(r"https?://[^\s<>()\[\]]+")
# Emphasis: a closing * may touch a letter (CJK text has no spaces), an _ may not (snake_case).
_EMPHASIS = (
    re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*"),
    re.compile(r"(?<![\w_])__(?=\S)(.+?)(?<=\S)__(?![\w_])"),
    re.compile(r"~~(?=\S)(.+?)(?<=\S)~~"),
    re.compile(r"(?<!\*)\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?!\*)"),
    re.compile(r"(?<![\w_])_(?=[^\s_])(.+?)(?<=[^\s_])_(?![\w_])"),
)
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|>~])")
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
_KEPT = re.compile("\x00(\\d+)\x00")  # a piece of text set aside from inline processing
_TAKEN = "\x02"  # where an image was taken out of the text
_TAKEN_AT_END = re.compile(r"^[ \t]*(?:\x02[ \t]*)+|(?:[ \t]*\x02)+[ \t]*$")
_TAKEN_INSIDE = re.compile(r"[ \t]*\x02(?:[ \t]*\x02)*[ \t]*")
_BLANKS = re.compile(r"\n{3,}")

_BREAKS = (  # where `split` prefers to cut, best first: (pattern, keep the match in the piece)
    re.compile(r"\n\s*\n"),
    re.compile(r"\n"),
    re.compile(r"(?<=[。！？!?；;])|(?<=[.!?])\s"),
    re.compile(r"\s"),
)


def plain(text: str, *, image_allowed: Callable[[str], bool] = lambda url: False) -> PlainText:
    """``text`` (Markdown) as plain chat text and its sendable images (see the module)."""
    images: list[str] = []
    out: list[str] = []
    fence: str | None = None
    lines = text.replace("\r\n", "\n").split("\n")
    for number, line in enumerate(lines):
        if fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            else:
                out.append(line)
            continue
        opening = _FENCE.match(line)
        if opening:
            fence = opening.group(1)
            continue
        around = (lines[number - 1] if number else "", lines[number + 1 : number + 2] or [""])
        out.append(_block_line(line, around[0], around[1][0], out, images, image_allowed))
    flat = "\n".join(line for line in out if line is not _DROPPED).strip("\n")
    return PlainText(_BLANKS.sub("\n\n", flat), tuple(images))


_DROPPED = "\x01"  # a line that disappears (a table rule, a setext underline)


def _block_line(
    line: str,
    previous: str,
    following: str,
    out: list[str],
    images: list[str],
    image_allowed: Callable[[str], bool],
) -> str:
    """One line outside code: its block marks turned into plain ones, then its inline marks."""

    def inline(part: str) -> str:
        return _inline(part, images, image_allowed)

    if _SETEXT.match(line) and out and out[-1].strip() and out[-1] is not _DROPPED:
        return _DROPPED  # the line above is the heading: its text is kept as is
    if _RULE.match(line):
        return ""
    if _TABLE_RULE.match(line) and "|" in line and _is_table_row(previous):
        return _DROPPED
    heading = _HEADING.match(line)
    if heading:
        return inline(heading.group(1))
    quote = _QUOTE.match(line)
    if quote:
        inner = _block_line(quote.group(1), previous, following, out, images, image_allowed)
        return "│ " + inner
    bullet = _BULLET.match(line)
    if bullet and not _RULE.match(line):
        indent, task, rest = bullet.groups()
        mark = "•" if task is None else ("☐" if task == " " else "☑")
        return f"{_indent(indent)}{mark} {inline(rest)}"
    ordered = _ORDERED.match(line)
    if ordered:
        indent, number, dot, rest = ordered.groups()
        return f"{_indent(indent)}{number}{dot} {inline(rest)}"
    if _is_table_row(line) and (_is_table_row(following) or _is_table_row(previous)):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        return " | ".join(inline(c) for c in cells)
    return inline(line.rstrip())


def _indent(spaces: str) -> str:
    """Nested list items: two spaces for every two of the source's (a tab is four)."""
    return "  " * (len(spaces.replace("\t", "    ")) // 2)


def _is_table_row(line: str) -> bool:
    stripped = line.strip()
    return stripped.count("|") >= 2 or (stripped.startswith("|") and stripped.endswith("|"))


def _inline(text: str, images: list[str], image_allowed: Callable[[str], bool]) -> str:
    """Inline Markdown of one line as plain text: code, images, links, emphasis, escapes."""
    kept: list[str] = []

    def keep(piece: str) -> str:
        kept.append(piece)
        return f"\x00{len(kept) - 1}\x00"

    text = _CODE_SPAN.sub(lambda m: keep(m.group(2).strip() or m.group(2)), text)
    text = _ESCAPE.sub(lambda m: keep(m.group(1)), text)  # \* is a star, never emphasis

    def image(match: re.Match[str]) -> str:
        alt, url = match.group(1).strip(), match.group(2)
        if image_allowed(url):
            images.append(url)
            return _TAKEN
        return keep(f"{alt} ({url})" if alt else url)

    text = _IMAGE.sub(image, text)
    if _TAKEN in text:  # no double space, nor one at an end, where an image was taken out
        text = _TAKEN_AT_END.sub("", text)
        text = _TAKEN_INSIDE.sub(" ", text)

    def link(match: re.Match[str]) -> str:
        words, url = match.group(1).strip(), match.group(2)
        if words in (url, url.removeprefix("mailto:")):
            return keep(url)
        return f"{words} ({keep(url)})"

    text = _LINK.sub(link, text)
    text = _AUTOLINK.sub(lambda m: keep(m.group(1).removeprefix("mailto:")), text)
    text = _BARE_URL.sub(lambda m: keep(m.group(0)), text)
    text = _BR.sub("\n", text)
    for pattern in _EMPHASIS:
        while True:  # nested emphasis (***both***) unwraps one layer per pass
            changed = pattern.sub(r"\1", text)
            if changed == text:
                break
            text = changed
    while _KEPT.search(text):  # a kept link text may hold a kept url
        text = _KEPT.sub(lambda m: kept[int(m.group(1))], text)
    return text if text.strip() else ""


def split(text: str, limit: int) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, cut at the best boundaries.

    Blank pieces are left out; a text within the limit is one piece. Raises ValueError for a
    limit below 1.
    """
    if limit < 1:
        raise ValueError(f"a message limit must be 1 or more, got {limit}")
    pieces: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        window = rest[: limit + 1]
        at = _cut_at(window, limit)
        piece, rest = rest[:at].rstrip(), rest[at:].strip()
        if piece:
            pieces.append(piece)
    if rest:
        pieces.append(rest)
    return pieces


def _cut_at(window: str, limit: int) -> int:
    """Where to cut ``window`` (``limit`` + 1 characters): the best boundary past its middle."""
    floor = limit // 2  # a boundary too early would make many tiny messages
    for pattern in _BREAKS:
        ends = [m.end() for m in pattern.finditer(window) if floor <= m.end() <= limit]
        if ends:
            return ends[-1]
    return limit
