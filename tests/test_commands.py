"""Slash commands: built-ins answered without the model, custom templates, reload, /cmd."""

from __future__ import annotations

import json
import logging

import pytest

from ania_nb.governance.commands import expand, parse_commands, parse_slash
from ania_nb.testing import reply


def commands_agent(make_agent, tmp_path, commands: dict | None = None, **overrides):
    path = tmp_path / "commands.json"
    if commands is not None:
        path.write_text(json.dumps({"commands": commands}))
    agent = make_agent(overrides={"commands.file": str(path), **overrides})
    return agent, path


def sent_text(request) -> str:
    return request.messages[-1]["content"].split("] ", 1)[1]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("/plan on", ("plan", "on")),
        ("  /Review   the diff\nline two ", ("review", "the diff\nline two")),
        ("/x", ("x", "")),
        ("/usr/bin/python is broken", None),
        ("/ spaced", None),
        ("say /hi", None),
        ("/9lives", None),
    ],
)
def test_parse_slash(text, parsed):
    assert parse_slash(text) == parsed


def test_expand_replaces_args_or_appends_them():
    assert expand("Translate to French: $args. Again: $args", "hi") == (
        "Translate to French: hi. Again: hi"
    )
    assert expand("Summarise the notebook", "briefly") == "Summarise the notebook\nbriefly"
    assert expand("Summarise the notebook", "") == "Summarise the notebook"


@pytest.mark.parametrize(
    ("commands", "problem"),
    [
        ({"stop": "x"}, "/stop is a built-in command"),
        ({"Help": "x"}, "/help is a built-in command"),
        ({"1st": "x"}, "command name '1st' is invalid"),
        ({"a" * 33: "x"}, "is invalid"),
        ({"ok": "  "}, "/ok: the template must be a non-empty string"),
        ({"ok": "x" * 2001}, "at most 2000"),
        ({"Dup": "a", "dup": "b"}, "defined twice"),
    ],
)
def test_bad_command_files_are_rejected(commands, problem):
    with pytest.raises(ValueError, match=problem):
        parse_commands({"commands": commands})


async def test_custom_command_is_expanded_and_processed_as_a_message(llm, make_agent, tmp_path):
    agent, _ = commands_agent(make_agent, tmp_path, {"fr": "Translate into French: $args"})
    llm.script(reply("Bonjour"))
    result = await agent.chat("/FR good morning", session="c")
    assert result.text == "Bonjour"
    assert sent_text(llm.requests[0]) == "Translate into French: good morning"
    [record] = await agent.runs(session="c")
    assert record.input == "Translate into French: good morning"


async def test_builtins_and_unknown_commands_answer_without_the_model(llm, make_agent, tmp_path):
    agent, _ = commands_agent(make_agent, tmp_path, {"fr": "Translate into French: $args"})
    help_text = (await agent.chat("/help")).text
    for name in ("/stop", "/plan", "/cmd", "/help", "/clock", "/fr"):
        assert name in help_text
    unknown = await agent.chat("/frr bonjour")
    assert unknown.ok and unknown.text.startswith("Unknown command /frr.\nCommands:")
    assert "/fr — Translate into French: $args" in unknown.text
    assert (await agent.chat("/reboot now")).text == "/reboot is not available in this agent."
    assert llm.requests == []
    llm.script(reply("a path"))
    await agent.chat("/usr/bin/python crashes")  # not a command: an ordinary message
    assert sent_text(llm.requests[0]) == "/usr/bin/python crashes"


async def test_the_file_is_reloaded_and_a_bad_edit_keeps_the_last_good_set(
    llm, make_agent, tmp_path, caplog
):
    agent, path = commands_agent(make_agent, tmp_path, {"hi": "Say hello"})
    now = [0.0]
    agent.governance.commands.file.clock = lambda: now[0]
    llm.script(reply("1"), reply("2"), reply("3"))
    await agent.chat("/hi")
    path.write_text(json.dumps({"commands": {"hi": "Say hi in Welsh"}}))
    now[0] = 5.0
    await agent.chat("/hi")
    path.write_text('{"commands": {"hi": "broken", "stop": "shadowing"}}')
    now[0] = 10.0
    with caplog.at_level(logging.WARNING):
        await agent.chat("/hi")
    assert [sent_text(r) for r in llm.requests] == [
        "Say hello",
        "Say hi in Welsh",
        "Say hi in Welsh",
    ]
    assert any("/stop is a built-in" in r.getMessage() for r in caplog.records)


async def test_cmd_add_and_del_are_for_admins_and_persist_atomically(llm, make_agent, tmp_path):
    agent, path = commands_agent(
        make_agent, tmp_path, {"hi": "Say hello"}, **{"admin.ids": ["root"]}
    )
    assert (await agent.chat("/cmd", sender="bob")).text == "Custom commands:\n/hi — Say hello"
    refused = await agent.chat("/cmd add tr Translate: $args", sender="bob")
    assert refused.text == "/cmd add is for admins only."
    assert (await agent.chat("/cmd del hi", sender="bob")).text == "/cmd del is for admins only."
    saved = await agent.chat("/cmd add TR Translate into Welsh:\n$args", sender="root")
    assert saved.text == "Saved /tr."
    assert json.loads(path.read_text()) == {
        "commands": {"hi": "Say hello", "tr": "Translate into Welsh:\n$args"}
    }
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".commands")] == []
    stop = await agent.chat("/cmd add stop now", sender="root")
    assert stop.text == "Not saved: /stop is a built-in command and cannot be redefined"
    assert (await agent.chat("/cmd add tr", sender="root")).text.startswith("usage: /cmd")
    llm.script(reply("Bore da"))
    await agent.chat("/tr good morning", sender="bob")  # usable at once, no reload wait
    assert sent_text(llm.requests[0]) == "Translate into Welsh:\ngood morning"
    assert (await agent.chat("/cmd rm hi", sender="root")).text == "Deleted /hi."
    assert (await agent.chat("/cmd rm hi", sender="root")).text == "There is no custom command /hi."
    assert json.loads(path.read_text()) == {"commands": {"tr": "Translate into Welsh:\n$args"}}
    # the trusted local user (no sender, e.g. a notebook) counts as an admin
    assert (await agent.chat("/cmd add x y")).text == "Saved /x."


async def test_cmd_refuses_to_overwrite_a_broken_file(make_agent, tmp_path):
    agent, path = commands_agent(make_agent, tmp_path)
    path.write_text('{"commands": {"a": ')
    answer = await agent.chat("/cmd add b hello")
    assert answer.text.startswith("Not saved: the commands file") and "fix it first" in answer.text
    assert path.read_text() == '{"commands": {"a": '
