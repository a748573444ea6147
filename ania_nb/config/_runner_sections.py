"""Config section of the headless runner (``ania-nb serve``) and its chat-platform adapter."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from ._sections import Section, _secret


class RunnerSettings(Section):
    """`ania-nb serve`: the chat platform connection, routing and flow control."""

    adapter: Literal["onebot"] = Field("onebot", description="Chat platform protocol.")
    mode: Literal["reverse", "forward"] = Field(
        "reverse",
        description="reverse: listen for the OneBot implementation's WebSocket; forward: dial "
        "the implementation's WebSocket server at runner.url.",
    )
    url: str = Field(
        "ws://127.0.0.1:3001", description="forward mode: the implementation's WebSocket URL."
    )
    host: str = Field(
        "127.0.0.1",
        description="reverse mode: address to listen on; anything but loopback needs "
        "runner.access_token.",
    )
    port: int = Field(8095, ge=0, le=65535, description="reverse mode: port (0 = any free).")
    path: str = Field("/onebot/v11/ws", description="reverse mode: WebSocket path.")
    access_token: SecretStr | None = _secret(
        "OneBot access token: sent by forward mode, required from the implementation in reverse "
        "mode (Authorization: Bearer …)."
    )
    action_timeout: float = Field(
        10.0, gt=0, le=120, description="Seconds an action (send, get_msg, …) may take."
    )
    reconnect_max: float = Field(
        30.0, ge=1, le=600, description="forward mode: longest pause between reconnects (s)."
    )
    group_trigger: Literal["mention", "mention_or_reply", "all"] = Field(
        "mention_or_reply",
        description="Which group messages are answered: @-mentions, also replies to the bot, "
        "or every message. Private messages are always answered.",
    )
    max_concurrent_runs: int = Field(
        8,
        ge=0,
        description="Runs of all sessions at once (served chats and notebooks alike); more wait "
        "their turn in their session's queue, never dropped (0 = no limit). With several "
        "replicas on one PostgreSQL store the limit is per replica.",
    )
    replica_id: str = Field(
        "",
        max_length=200,
        description="This replica's name among the replicas of `ania-nb serve` sharing one "
        "PostgreSQL store (`ania-nb serve --replica-id`); unique among live replicas. Empty: "
        "<host>:<pid>, new at every start. Ignored with the SQLite store (one replica).",
    )
    group_clear_after: int = Field(
        30,
        ge=0,
        description="Clear a group's history and session MCP loads after this many messages "
        "not addressed to the bot (0 = never).",
    )
    queued_notice: str | None = Field(
        None,
        description="Sent once when a message waits for the current reply: unset = the "
        "catalogue's text in ui.language, '' = none, any other text = sent as written.",
    )
    overflow_notice: str | None = Field(
        None,
        description="Sent when the session's queue is full: unset = the catalogue's text in "
        "ui.language, '' = none, any other text = sent as written.",
    )
    markdown: Literal["plain", "keep"] = Field(
        "plain",
        description="plain: Markdown in replies becomes plain chat text (emphasis and headings "
        "dropped, lists and code readable, links as 'text (url)', http(s) images sent as "
        "images); keep: sent as written.",
    )
    message_chars: int = Field(
        3000,
        ge=200,
        le=20000,
        description="Longest text of one chat message; a longer one is split at paragraph, "
        "line or sentence ends into several messages.",
    )
    approval_chars: int = Field(
        1500, ge=200, description="Characters of an approval request shown in the chat."
    )
    inbox_window: float = Field(
        7 * 86400.0,
        gt=0,
        description="Seconds a handled message stays in the inbox (a re-sent event within it "
        "is recognised and not answered again) and a sent message in the outbox; older ones "
        "are pruned.",
    )
    resume: Literal["notify", "rerun"] = Field(
        "notify",
        description="A reply cut off by a crash or kill: notify tells the chat once to send "
        "the message again; rerun answers it again, but only if no tool with side effects had "
        "started (else it notifies).",
    )
    ws_compression: bool = Field(
        False,
        description="Negotiate permessage-deflate on the OneBot WebSocket: smaller frames on a "
        "slow link to the implementation, more CPU per message (off: frames are small JSON, "
        "usually on the same machine).",
    )
    grace_seconds: float = Field(
        20.0, ge=0, le=600, description="On shutdown, how long running replies may finish."
    )
