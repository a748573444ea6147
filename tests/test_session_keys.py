"""The session-key grammar (`ania_nb.session_keys`) and the places that read it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ania_nb import session_keys as keys
from ania_nb.runner.model import ChatRef
from ania_nb.session_keys import SessionKey


@pytest.mark.parametrize(
    ("key", "kind", "id_"),
    [
        ("g:123", "group", "123"),
        ("f:42", "private", "42"),
        ("nb:default", "notebook", "default"),
        ("nb:3f2a9c01", "notebook", "3f2a9c01"),
        ("global", "global", ""),
        ("g:a:b", "group", "a:b"),  # only the first colon separates
        ("nb:a~20250101-120000", "notebook", "a~20250101-120000"),  # an archive parses as its key
        # Not one of the forms: the API's free session names.
        ("g:", "other", "g:"),  # a prefix without an id is no chat
        ("f:", "other", "f:"),
        ("nb:", "other", "nb:"),
        ("", "other", ""),
        ("demo", "other", "demo"),
        ("G:1", "other", "G:1"),  # prefixes are case-sensitive
        ("GLOBAL", "other", "GLOBAL"),
        (" global", "other", " global"),
        (" g:1", "other", " g:1"),
        ("qq:1", "other", "qq:1"),  # a sender id, not a session key
        ("g1", "other", "g1"),
    ],
)
def test_parse_gives_kind_and_id(key: str, kind: str, id_: str) -> None:
    parsed = keys.parse(key)
    assert (parsed.kind, parsed.id) == (kind, id_)
    assert str(parsed) == key


@given(st.text())
def test_every_string_parses_and_prints_back(key: str) -> None:
    parsed = keys.parse(key)
    assert str(parsed) == key
    assert keys.parse(str(parsed)) == parsed


def test_builders_and_their_inverse() -> None:
    assert keys.group_key("123") == "g:123"
    assert keys.private_key("42") == "f:42"
    assert keys.notebook_key("default") == keys.DEFAULT_NOTEBOOK == "nb:default"
    assert keys.GLOBAL == "global"
    for built in (keys.group_key("1"), keys.private_key("2"), keys.notebook_key("x")):
        assert str(keys.parse(built)) == built


@pytest.mark.parametrize(
    ("kind", "id_"),
    [("group", ""), ("private", ""), ("notebook", ""), ("global", "x"), ("other", "g:1")],
)
def test_impossible_keys_are_refused(kind: str, id_: str) -> None:
    with pytest.raises(ValueError):
        SessionKey(kind, id_)  # type: ignore[arg-type]
    builders = {"group": keys.group_key, "private": keys.private_key, "notebook": keys.notebook_key}
    if kind in builders and not id_:
        with pytest.raises(ValueError, match="needs an id"):
            builders[kind](id_)


def test_is_group_and_is_chat() -> None:
    assert keys.is_group("g:1")
    assert not keys.is_group("g:")  # the old startswith("g:") said yes
    assert not keys.is_group("f:1")
    assert not keys.is_group("nb:g:1")
    assert keys.parse("g:1").is_chat and keys.parse("f:1").is_chat
    assert not any(keys.parse(k).is_chat for k in ("nb:x", "global", "demo", "g:"))


def test_describe_reads_each_kind() -> None:
    assert keys.describe("g:123") == "the group chat 123 (session g:123)"
    assert keys.describe("f:42") == "the private chat with 42 (session f:42)"
    assert keys.describe("nb:demo") == "the notebook session 'demo' (session nb:demo)"
    assert keys.describe("global") == "session global"
    assert keys.describe("g:") == "session g:"
    assert keys.describe("demo") == "session demo"


def test_read_scopes_put_the_session_first_and_global_once() -> None:
    assert keys.read_scopes("nb:a") == ["nb:a", "global"]
    assert keys.read_scopes("global") == ["global"]


def test_archives_name_their_key() -> None:
    archive = keys.archive_key("nb:a", "20250101-120000")
    assert archive == "nb:a~20250101-120000"
    assert keys.archived_from(archive) == "nb:a"
    assert keys.archived_from(keys.archive_key("nb:a", "20250101-120000-2")) == "nb:a"
    assert keys.archived_from("nb:a") == "nb:a"
    for bad in ("", "x~y"):
        with pytest.raises(ValueError, match="archive stamp"):
            keys.archive_key("nb:a", bad)


def test_chat_refs_follow_the_grammar() -> None:
    assert ChatRef("group", "123").session == "g:123"
    assert ChatRef("private", "42").session == "f:42"
    assert ChatRef.from_session("g:123") == ChatRef("group", "123")
    assert ChatRef.from_session("f:42") == ChatRef("private", "42")
    for other in ("nb:default", "global", "g:", "f:", "demo", ""):
        assert ChatRef.from_session(other) is None


def test_the_clock_and_knowledge_tools_describe_their_scope_without_the_session() -> None:
    """Both tool families say "the current chat": their bytes are equal in every session."""
    from ania_nb.clock.tools import _SessionTool
    from ania_nb.knowledge.tools import _SessionTool as _KnowledgeTool

    class ClockTool(_SessionTool):
        description = "Clock."

    class KnowledgeTool(_KnowledgeTool):
        description = "Knowledge."

    for session in ("g:123", "f:9", "nb:default"):
        clock = ClockTool(None, session)  # type: ignore[arg-type]
        kb = KnowledgeTool(None, session, None)  # type: ignore[arg-type]
        assert clock.description == "Clock. Scope: the tasks of the current chat only."
        assert kb.description == "Knowledge. Scope: the current chat."
