"""``ania-nb serve``: the Agent served to a chat platform until SIGINT/SIGTERM.

Wiring, in order: load the config (``ania.toml`` or ``--config``, then ``ANIA_*``), open the
Agent (store, MCP, skills; the clock starts with it and takes the clock lease), build the
adapter from the ``runner`` section and the `Router` on top of it, start the router (it becomes
the durable outbox's deliverer and recovers what a previous process left: pending messages are
answered, cut-off replies re-run or announced), start the adapter; once it is connected, post
again the approvals a previous process left open (`Agent.resume_approvals`). On the first
signal: stop queueing messages (new ones are stored and answered after the restart), suspend the
runs blocked only on an approval at once (record ``interrupted``, asked again after the
restart), let running replies and background subagents finish for ``runner.grace_seconds``,
stop the rest (their run records end ``stopped``; each stopped background subagent's chat gets
one notice), close the adapter, then the Agent (clock, MCP sessions, store). A
second signal skips the rest of the grace period.

If the adapter's connection loop stops by itself (a bug: no frame and no network failure may
end it), the runner logs why and shuts down the same way, exiting 1, so a supervisor
(``Restart=on-failure``) starts it again instead of leaving a process that no longer connects.

Exit codes: 0 after a signal-initiated shutdown; 2 when it cannot start (bad config, no model
configured: the notebook's first-run check of ``llm.base_url``, ``llm.model`` and a hosted
endpoint's ``llm.api_key``, a listener that may not or cannot be opened); 1 on a crash or a
connection loop that stopped.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..addresses import is_loopback
from ..errors import StoreError, UsageError
from .model import AdapterError
from .redact import MCPSecrets, SecretRedactor, config_secrets

if TYPE_CHECKING:
    from ..agent import Agent
    from ..config import Config, RunnerSettings
    from .model import Adapter
    from .onebot import OneBotAdapter
    from .router import Router

log = logging.getLogger("ania_nb.runner")

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_CANNOT_START = 2
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"
# Libraries that log every request or job at INFO: a served bot would drown in them.
_CHATTY = ("apscheduler",)
# Libraries whose DEBUG lines print request lines, headers (the OneBot token in websockets'
# handshake, API keys) or whole frames: never below INFO, whatever --log-level says.
_LEAKY = ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "websockets", "mcp")


class StartError(UsageError):
    """The runner cannot start; the message says why (exit code 2)."""


def configure_logging(level: str = "INFO") -> SecretRedactor:
    """One line per record on stderr: ``2026-12-01 03:00:00 INFO ania_nb.runner: …``.

    Returns the handler's `SecretRedactor`; give it the config and the Agent to know their
    secrets (`main` and `serve` do).
    """
    redactor = SecretRedactor(LOG_FORMAT, LOG_DATEFMT)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(redactor)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    quiet = max(logging.WARNING, logging.getLevelName(level))
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else quiet)
    for name in _LEAKY:
        logging.getLogger(name).setLevel(logging.INFO if level == "DEBUG" else quiet)
    return redactor


def check_settings(settings: RunnerSettings) -> None:
    """Refuse what must not start: a non-loopback reverse listener without an access token."""
    if settings.mode != "reverse":
        return
    token = settings.access_token.get_secret_value() if settings.access_token else ""
    if not token and not is_loopback(settings.host):
        raise StartError(
            f"runner.host is {settings.host!r} (not loopback) and runner.access_token is not set: "
            "anyone who can reach the port could drive the bot. Set runner.access_token "
            "(ANIA_RUNNER__ACCESS_TOKEN) or listen on 127.0.0.1."
        )
    if not settings.path.startswith("/"):
        raise StartError(f"runner.path must start with '/', got {settings.path!r}")


def check_model(config: Config) -> None:
    """Refuse to start without a model: name every missing ``llm.*`` key (the first-run check).

    Without it the runner would start, say "ready" and answer every chat with an error.
    """
    from ..config import env_name, join_keys, missing_model_keys

    missing = missing_model_keys(config)
    if not missing:
        return
    verb = "is" if len(missing) == 1 else "are"
    why = (
        "the endpoint needs a key (a server on this machine or a private network does not)"
        if missing == ["llm.api_key"]
        else "ania-nb has no default model; llm.api_key may stay empty only for a server on "
        "this machine or a private network"
        if "llm.api_key" in missing
        else "ania-nb has no default model"
    )
    raise StartError(
        f"the model is not configured: {join_keys(missing)} {verb} not set ({why}). Set "
        f"{'it' if len(missing) == 1 else 'them'} under [llm] in ania.toml (or the --config "
        f"file), or as {join_keys([env_name(key) for key in missing])}."
    )


def describe(settings: RunnerSettings, listen_url: str | None = None) -> str:
    """Where the runner is connected or listening, for the start-up log line."""
    secured = "with access token" if settings.access_token else "no access token"
    if settings.mode == "forward":
        url = urlsplit(settings.url)._replace(query="").geturl()  # a token may sit in the query
        return f"OneBot v11 forward WebSocket: dialling {url} ({secured})"
    address = listen_url or f"ws://{settings.host}:{settings.port}{settings.path}"
    return f"OneBot v11 reverse WebSocket: listening on {address} ({secured})"


def _make_adapter(settings: RunnerSettings) -> OneBotAdapter:
    if settings.adapter != "onebot":  # pragma: no cover - the config allows only onebot
        raise StartError(f"unknown runner.adapter {settings.adapter!r}")
    from .onebot import OneBotAdapter

    return OneBotAdapter(settings)


async def serve(
    config: Config,
    stop: asyncio.Event,
    hurry: asyncio.Event | None = None,
    redactor: SecretRedactor | None = None,
) -> int:
    """Serve until ``stop`` is set, then shut down cleanly; ``hurry`` cuts the grace short.

    ``redactor`` (the log's) learns the Agent's secrets: its config and its MCP servers'.
    """
    from ..agent import Agent
    from .router import Router

    check_settings(config.runner)
    check_model(config)  # before the store, MCP and any connection: never a bot that cannot answer
    agent = Agent(config)
    if redactor is not None:
        redactor.add_source(MCPSecrets(agent))
    adapter: OneBotAdapter | None = None
    try:
        try:
            await agent.start()
        except StoreError as exc:  # the server is unreachable, refuses us, or is too new
            raise StartError(str(exc)) from exc
        settings = agent.config.runner  # values saved by config_set apply from here
        if redactor is not None:  # their secrets too
            redactor.add_secrets(config_secrets(agent.config))
        check_settings(settings)
        check_model(agent.config)
        adapter = _make_adapter(settings)
        router = Router(agent, adapter)
        try:
            await router.start()  # the durable outbox, and what a previous process left
        except StoreError as exc:  # e.g. this replica id is a live replica's
            raise StartError(str(exc)) from exc
        try:
            await adapter.start(router.handle)
        except OSError as exc:  # the port is taken, the address is not ours, …
            raise StartError(f"cannot listen on {settings.host}:{settings.port}: {exc}") from exc
        except (AdapterError, UsageError) as exc:  # the adapter refused to start, and why
            raise StartError(str(exc)) from exc
        log.info("serving %s", describe(settings, adapter.listen_url))
        log.info("ready (model %s, data in %s)", agent.config.llm.model, agent.data_dir)
        resuming = asyncio.ensure_future(resume_approvals_when_connected(agent, adapter))
        try:
            broken = await _wait_stop_or_broken(stop, adapter)
        finally:
            resuming.cancel()
        if broken is not None:
            log.error(
                "%s: the runner cannot reach the chat platform any more and exits with code %d "
                "so that its supervisor restarts it",
                broken,
                EXIT_CRASH,
            )
        log.info("stopping: no new messages; running replies get %gs", settings.grace_seconds)
        await _close_router(router, settings.grace_seconds, hurry)
    finally:
        if adapter is not None:
            await adapter.aclose()
        await agent.aclose()
    log.info("stopped")
    return EXIT_OK if broken is None else EXIT_CRASH


async def resume_approvals_when_connected(agent: Agent, adapter: Adapter) -> None:
    """Once connected, ask again the approvals the last run of the bot left open.

    Posted before a connection, a card would fail and deny its call at once.
    """
    await adapter.wait_connected()
    try:
        await agent.resume_approvals()
    except Exception:  # the bot still serves; the rows stay open for the next start
        log.exception("could not ask again the approvals left open by the last run")


async def _wait_stop_or_broken(stop: asyncio.Event, adapter: OneBotAdapter) -> str | None:
    """Wait for a stop signal or a connection loop that died; why it died, or None."""
    stopping = asyncio.ensure_future(stop.wait())
    broken = asyncio.ensure_future(adapter.wait_broken())
    try:
        await asyncio.wait({stopping, broken}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        broken.cancel()
    return broken.result() if broken.done() and not broken.cancelled() else None


async def _close_router(router: Router, grace: float, hurry: asyncio.Event | None) -> None:
    """`Router.close` with its grace; a second signal (``hurry``) makes it zero."""
    closing = asyncio.ensure_future(router.close(grace))
    if hurry is None:
        await closing
        return
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait({closing, hurried}, return_when=asyncio.FIRST_COMPLETED)
        if not closing.done():
            log.warning("second signal: stopping the running replies now")
            await router.close(0)
            await closing
    finally:
        hurried.cancel()


async def _serve_with_signals(config: Config, redactor: SecretRedactor | None = None) -> int:
    stop, hurry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            hurry.set()
        else:
            log.info("%s received", name)
            stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await serve(config, stop, hurry, redactor)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def main(
    config_path: Path | None = None, log_level: str = "INFO", *, replica_id: str | None = None
) -> int:
    """Run ``ania-nb serve``: configure logging, load the config, serve; returns the exit code.

    ``replica_id`` (``--replica-id``) overrides ``runner.replica_id``.
    """
    redactor = configure_logging(log_level)
    try:
        from ..config import Config

        config = Config.load(config_path)
        if replica_id is not None:
            config = config.with_overrides({"runner.replica_id": replica_id})
        redactor.add_secrets(config_secrets(config))
        check_settings(config.runner)
        return asyncio.run(_serve_with_signals(config, redactor))
    except (UsageError, StartError) as exc:  # bad config, refused or impossible listener
        log.error("cannot start: %s", exc)
        return EXIT_CANNOT_START
    except KeyboardInterrupt:  # a signal before the handlers were installed
        log.info("interrupted before start")
        return EXIT_OK
    except Exception:
        log.exception("crashed")
        return EXIT_CRASH
