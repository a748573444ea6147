"""The message catalogue: one language per message, both languages complete, the right default.

`foreign` is the check the runner tests use on every text a chat receives, too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import pytest

from ania_nb.catalogue import CATALOGUE, LANGUAGES, language_for, placeholders, say
from ania_nb.config import Config

CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")
LATIN_WORD = re.compile(r"[A-Za-z][A-Za-z_]*")
# Latin words a Chinese text may hold: names of commands, their sub-commands and arguments,
# config keys and values, and terms Chinese users write in Latin letters.
NAMES_IN_CHINESE = frozenset(
    {
        *("AI", "MCP", "JSON", "token", "SESSION", "name", "value", "template"),
        *("llm", "text_tool_calls", "false", "auto", "admin", "ids", "commands", "enable"),
        *("plan", "on", "off", "status", "cmd", "list", "add", "del", "help", "quota", "reset"),
        *("clock", "info", "timeout", "run", "log", "all"),
    }
)


def foreign(text: str, language: str, names: Iterable[str] = ()) -> list[str]:
    """What in ``text`` is of the other language: CJK in English, Latin words in Chinese.

    ``names`` (tool names, ids, user content) are taken out first; in Chinese the Latin words
    of `NAMES_IN_CHINESE` are names too.
    """
    for name in sorted(names, key=len, reverse=True):
        text = text.replace(name, " ")
    if language == "en":
        return CJK.findall(text)
    return [w for w in LATIN_WORD.findall(text) if w not in NAMES_IN_CHINESE]


def _template(text: str) -> str:
    """A catalogue text without its placeholders (their values are names or other texts)."""
    return re.sub(r"\{[^}]*\}", " ", text)


def test_every_message_has_both_languages_and_no_new_placeholders() -> None:
    for key, texts in CATALOGUE.items():
        assert set(texts) == set(LANGUAGES), key
        # Chinese may leave out a detail the English shows (an English reason), never add one.
        assert placeholders(texts["zh"]) <= placeholders(texts["en"]), key


@pytest.mark.parametrize("language", LANGUAGES)
def test_no_message_holds_text_of_the_other_language(language: str) -> None:
    found = {key: foreign(_template(texts[language]), language) for key, texts in CATALOGUE.items()}
    assert {key: words for key, words in found.items() if words} == {}


def test_the_check_itself_sees_a_mixed_message() -> None:
    # The line of issue 33 and a half-English card: both are caught.
    mixed = "无法审批：'qq:99999' may not answer this request"
    assert foreign(mixed, "zh", names=["qq:99999"]) == ["may", "not", "answer", "this", "request"]
    assert foreign("analyst (分析师)", "en") == ["分", "析", "师"]
    assert foreign("已允许：danger（请求 ab12）", "zh", names=["danger", "ab12"]) == []


def test_say_fills_placeholders_and_refuses_unknown_keys() -> None:
    assert say("approval.allowed", "zh", tool="bash", id="r1") == "已允许：bash（请求 r1）"
    assert say("approval.allowed", "en", tool="bash", id="r1") == "Allowed: bash (request r1)"
    with pytest.raises(KeyError):
        say("no.such.key", "en")


def test_each_front_end_has_its_language_unless_ui_language_is_set() -> None:
    assert Config().ui.language == ""
    assert [language_for("", s) for s in ("g:1", "f:2", "nb:default", "api", "global")] == [
        "zh",
        "zh",
        "en",
        "en",
        "en",
    ]
    assert language_for("en", "g:1") == "en" and language_for("zh", "nb:x") == "zh"
    assert Config.model_validate({"ui": {"language": "zh"}}).ui.language == "zh"
    with pytest.raises(ValueError, match="language"):
        Config.model_validate({"ui": {"language": "fr"}})
