"""``ania-nb chat``: the simulator's commands and rendering, and one real exchange end to end
(``ania-nb chat`` as a subprocess starting ``ania-nb serve``, the scripted model answering)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path
from typing import Any

from test_runner_serve import ANIA_NB, write_config

from ania_nb.testing import ScriptedLLM, reply
from ania_nb.testing.chat import HELP, Place, command, render, target_of
from ania_nb.testing.onebot import Action


def test_commands_move_between_chats_and_say_what_they_did():
    here = Place(10001)
    place, said, sent = command(":group 20001", here)
    assert place == Place(10001, 20001) and "group 20001 as 10001" in (said or "")
    assert sent is None
    assert command(":group 20001 30003", here)[0] == Place(30003, 20001)
    assert command(":private", Place(30003, 20001))[0] == Place(30003)
    assert command(":private 42", here)[0] == Place(42)
    assert command(":group x", here) == (here, "usage: :group GROUP [QQ]  (numbers)", None)
    assert command(":plain hi all", Place(1, 2)) == (Place(1, 2), None, "hi all")
    assert "for groups" in (command(":plain hi", here)[1] or "")
    assert command(":help", here) == (here, HELP, None)
    assert command(":quit", here)[0] is None
    assert "unknown command :frob" in (command(":frob", here)[1] or "")


def test_a_bot_message_is_shown_with_its_images_and_its_chat():
    action = Action(
        "send_group_msg",
        {
            "group_id": 20001,
            "message": [
                {"type": "reply", "data": {"id": "7"}},
                {"type": "at", "data": {"qq": "10001"}},
                {"type": "text", "data": {"text": " here you go"}},
                {"type": "image", "data": {"file": "https://example.com/cat.png"}},
            ],
        },
        echo=1,
    )
    assert render(action) == "@10001 here you go[image https://example.com/cat.png]"
    assert target_of(action) == "group 20001"
    private = Action("send_msg", {"message_type": "private", "user_id": 5, "message": "x"}, 2)
    assert target_of(private) == "private 5"


def answer(request: Any) -> Any:
    """Name what the turn's user text said (the chat's own words come back)."""
    turn = json.dumps(request.messages[-1].get("content"), ensure_ascii=False)
    said = re.findall(r"(hello bot|hi group)", turn)
    return reply("you said: " + (said[0] if said else "?"))


async def test_a_person_types_in_a_private_chat_and_a_group_and_reads_the_replies(tmp_path: Path):
    with ScriptedLLM(responder=answer) as llm:
        config = write_config(tmp_path / "ania.toml", llm, tmp_path / "data")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANIA_")}
        proc = await asyncio.create_subprocess_exec(
            ANIA_NB,
            "chat",
            "--config",
            str(config),
            "--settle",
            "1.5",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=tmp_path,
            env=env,
        )
        assert proc.stdin is not None and proc.stdout is not None
        connected = await asyncio.wait_for(proc.stdout.readline(), 60)  # "starting …"
        while b"connected to bot" not in connected:
            connected = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert b"you are in private 10001" in connected
        proc.stdin.write(b"hello bot\n")
        await proc.stdin.drain()
        first = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert first.decode().rstrip("\n") == "bot › you said: hello bot"
        proc.stdin.write(b":group 20001\nhi group\n:who\n")
        proc.stdin.close()
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert "now in group 20001 as 10001 (messages @ the bot; :plain TEXT does not)" in lines
    assert "bot › @10001 you said: hi group" in lines  # the group reply mentions the speaker
    assert "you are in group 20001 as 10001" in lines
