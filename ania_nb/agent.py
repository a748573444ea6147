"""The `Agent` façade: config, store, shared tools and sessions behind one object.

Front ends (the notebook magics, the headless runner, user code) talk to the engine only through
this class and the callbacks bridge.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._http import HttpClients
from .agents import Agents
from .agents.background import stopped_notice
from .catalogue import language_for
from .config import Config
from .engine.callbacks import NO_CALLBACKS, ApprovalRequest, Callbacks, Verdict
from .engine.context import BeforeCompact
from .engine.loop import Gate, GateDecision, ToolCall
from .engine.messages import Message
from .engine.usage import Tokens, charging
from .errors import LLMError, ToolError, UsageError
from .governance import ApprovalManager, Governance, PythonHook
from .governance.approval import (
    SUSPENDED,
    VERDICT_OUTCOMES,
    request_from_record,
    stored_verdict,
)
from .governance.commands import parse_slash
from .governance.plan import has_side_effects
from .knowledge import Knowledge
from .orchestration import (
    AgentHost,
    ApprovalSuspension,
    Conversation,
    Outbox,
    Pending,
    Resumption,
    RunLimits,
    RunServices,
    RunSpec,
    Runtime,
    Session,
    SessionQueues,
    SessionTable,
    TurnContext,
    answer_batch,
    answer_resumed,
    resolve_config,
)
from .orchestration.claims import SessionClaims
from .orchestration.inbox import (
    Accepted,
    Inbound,
    Recovery,
    inbound_of,
    restart_notice,
    stored_role,
)
from .orchestration.main_turn import reply_row
from .orchestration.outbox import Delivery, reply_delivery
from .orchestration.run import ModelSwitch
from .prompts import DEFAULT_SYSTEM_PROMPT
from .quota import Quota
from .quota.command import HELP as QUOTA_HELP
from .quota.command import quota_command
from .quota.fallback import FallbackClients
from .result import RunResult
from .store import ApprovalRow, InboxEntry, InboxState, OutboxRow, RunRecord
from .store.replicas import Replica, open_replica
from .tools import SessionToolExecutor, Tool, ToolExecutor
from .tools.builtin import HttpSource, ImageViewer, default_tools, gated_tools, image_viewer

if TYPE_CHECKING:  # pragma: no cover
    from .mcp import MCPRegistry
    from .mcp.sampling import SampledReply, SamplingRequest
    from .skills import SkillManager
    from .tools.base import ToolContext

log = logging.getLogger(__name__)


@dataclass
class _Resolved:
    """Counts of cut-off inbox rows resolved by recovery and sweeps."""

    rerun: int = 0
    notified: int = 0


CLOCK_HELP = "/clock list|add|del|on|off|info|timeout|run|log|help: scheduled tasks"
APPROVAL_ROWS_KEPT = 7 * 86400.0  # seconds an ended approval row is kept (pruned at resume)
KB_UPKEEP_SECONDS = 600.0  # a served Agent holding the clock compacts the knowledge this often


class Agent:
    """An LLM agent with tools, persistent per-session history and run records.

    >>> agent = Agent(base_url="http://127.0.0.1:8000/v1", api_key="sk-…", model="gpt-4o")
    >>> result = await agent.chat("What time is it?", session="nb:demo")
    >>> result.text, result.usage.total_tokens, [c.name for c in result.tool_calls]

    Keyword overrides: ``base_url``, ``api_key``, ``model``, ``data_dir`` or any dotted config key
    passed in ``overrides={"agent.max_iterations": 5}``. Your own HTTP clients (proxies, TLS,
    recording) go in ``http=HttpClients(llm=..., vision=..., web=..., mcp=factory)``; they stay
    open when the Agent closes. ``agent.host`` is what the clock, subagents and teams use
    (one-shot runs, injected messages, the store); users rarely need it.
    """

    def __init__(
        self,
        config: Config | None = None,
        *,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        overrides: dict[str, Any] | None = None,
        http: HttpClients | None = None,
        **shortcuts: Any,
    ) -> None:
        self._layers = resolve_config(config, shortcuts, overrides)
        self.config = self._layers.resolve()  # + the values saved by config_set once opened
        self.http = http or HttpClients()  # your own HTTP clients (proxies, TLS, recording)
        self.tools = ToolExecutor()
        self._user_tools: set[str] = set()
        for t in tools:
            self.add_tool(t, replace=True)
        self.approvals = ApprovalManager(timeout=self.config.approval.timeout)
        self._suspension = ApprovalSuspension()  # main runs' checkpoints (approvals at shutdown)
        self._resumed: set[asyncio.Task[None]] = set()  # approvals asked again after a restart
        # Where governance plugs into every run; replaceable (e.g. by tests or embedders).
        self.tool_gate: Gate | None = None
        self.before_compact: BeforeCompact | None = None
        self._session_tools: list[Callable[[str], Iterable[Tool]]] = [
            lambda name: self.governance.session_tools(name)
        ]
        self._web = HttpSource(self.http.web)
        self._builtins: set[str] = set()
        self._viewers: list[ImageViewer] = []
        self.sessions = SessionTable(
            self._new_session,
            max_sessions=self.config.agent.max_sessions,
            idle_seconds=self.config.agent.session_idle_seconds,
            in_use=lambda name: bool(self.approvals.pending(name)),
        )
        self.outbox = Outbox()  # final results of clock runs and background subagents
        self._queues = SessionQueues(
            self.sessions,
            self._answer,
            queue_size=lambda: self.config.agent.queue_size,
            cancel_approvals=self.approvals.cancel,
            unawaited=self._publish_reply,
            max_running=lambda: self.config.runner.max_concurrent_runs,
            finished=self._batch_finished,
            dropped=self._batch_dropped,
            started=self._worker_started,
            idle=self._worker_idle,
        )
        # What the clock, subagents and teams may ask of this Agent (they never hold it).
        self.host = AgentHost(
            config=lambda: self.config,
            governance=lambda: self.governance,
            open=self._opened,
            tools=self._session_executor,
            system_prompt=lambda: self.system_prompt,
            sessions=self.sessions,
            queues=self._queues,
            outbox=self.outbox,
            admit=self._quota_denial,
            queue_stored=self._queue_stored,
        )
        from .clock import Clock  # APScheduler: imported with the first Agent, not the package

        self.clock = Clock(self.host)  # scheduled tasks; starts when the Agent opens
        self.agents = Agents(self.host)  # subagents and teams of main sessions
        self.knowledge = Knowledge(lambda: self.config, self.data_dir)  # kb and memory
        self.quota = Quota(lambda: self.config, self.host.open_store)  # daily limits and usage
        self.knowledge.store.count_usage = self._count_embeddings  # an endpoint's tokens count
        self._quota_clients = FallbackClients(self.http.llm)  # quota.fallback_model's client
        self._assemble(self.config)
        self._session_tools.append(self._builtin_session_tools)
        self._rt: Runtime | None = None
        self._services: RunServices | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open_lock: asyncio.Lock | None = None
        self._closed = False
        self._accepting = True  # False from `stop_accepting` (a front end's shutdown) on
        self._settling: set[asyncio.Task[None]] = set()  # inbox rows being settled
        # A durable front end serving as a replica (`serve_replica`): claims on its sessions,
        # and how a row stored elsewhere gets its callbacks and its front end's say.
        self._claims: SessionClaims | None = None
        self._callbacks_of: Callable[[InboxEntry], Callbacks] | None = None
        self._route_stored: Callable[[InboxEntry], Awaitable[bool]] | None = None
        self._recovered = _Resolved()  # cut-off rows re-run or announced, since the start
        self._upkeeper: asyncio.Task[None] | None = None

    def _assemble(self, config: Config) -> None:
        """Build what the settings decide: governance, approval rules and the built-in tools.

        Runs at construction and again when the store's saved values change the config;
        plan mode, todos, Python hooks, session approvals and your own tools carry over.
        """
        self.config = config
        self.approvals.timeout = config.approval.timeout
        self.approvals.admins = frozenset(config.admin.ids)
        old: Governance | None = getattr(self, "governance", None)
        self.governance = Governance(
            config, self.tools, self.approvals, stop=self.stop, previous=old
        )
        if old is None or self.tool_gate is old.gate:
            self.tool_gate = self.governance.gate
        self._register_commands(self.governance)
        if old is None or self.before_compact == old.pre_compact:
            self.before_compact = self.governance.pre_compact
        viewer = image_viewer(config, self.http.vision_client)
        self._viewers.append(viewer)
        wanted: list[Tool] = []
        if config.agent.builtin_tools:
            wanted = [
                *default_tools(config, self._web, viewer),
                *gated_tools(config, viewer),
            ]
        names = {t.name for t in wanted}
        for gone in self._builtins - names - self._user_tools:
            self.tools.remove(gone)
        for builtin in wanted:
            if builtin.name not in self._user_tools:  # your tools win over built-ins
                self.tools.add(builtin, replace=True)
        self._builtins = names

    def _register_commands(self, governance: Governance) -> None:
        """The slash commands of the Agent's own parts: ``/clock``, ``/quota``, MCP prompts."""
        from .mcp.prompts import MCPPrompts

        governance.slash.register("clock", self.clock.command, CLOCK_HELP)
        governance.slash.server_commands = MCPPrompts(lambda: self.mcp)

        async def quota(session: str, args: str, sender: str | None) -> str:
            return await quota_command(self.quota, governance.is_admin, session, args, sender)

        governance.slash.register("quota", quota, QUOTA_HELP)

    # ----------------------------------------------------------------- set-up

    def add_tool(self, tool: Tool | Callable[..., Any], *, replace: bool = False) -> Tool:
        """Register a shared tool (a `BaseTool`, an ``@tool`` function or a typed function)."""
        added = self.tools.add(tool, replace=replace)
        self._user_tools.add(added.name)
        return added

    def add_session_tools(self, factory: Callable[[str], Iterable[Tool]]) -> None:
        """Give every main session, when it is created, the tools ``factory(session)`` makes."""
        self._session_tools.append(factory)

    def add_hook(self, event: str, hook: PythonHook) -> None:
        """Register a Python hook for an event (SessionStart, PreToolUse, Stop, …)."""
        self.governance.hooks.add(event, hook)

    def set_plan_mode(self, session: str, on: bool) -> None:
        """Turn plan mode on or off for a session (like ``/plan on|off``)."""
        self.governance.plan.set(self.session(session).name, on)

    def plan_mode(self, session: str = "nb:default") -> bool:
        """Whether a session is in plan mode."""
        return self.governance.plan.is_on(session)

    async def todos(self, session: str = "nb:default") -> list[dict[str, str]]:
        """The session's todo_write list (content, status, activeForm per item)."""
        await self._ensure_open()
        return await self.governance.todos.get(session)

    @property
    def system_prompt(self) -> str:
        """The system prompt sent first in every request (with the skills registry, once open)."""
        base = self.config.agent.system_prompt or DEFAULT_SYSTEM_PROMPT
        skills = self._rt.skills_prompt() if self._rt is not None else ""
        scene = ""
        if self.config.agent.builtin_tools:
            from .knowledge.inject import scene_prompt

            scene = scene_prompt(self.config)
        return "\n\n".join(p for p in (base, skills, scene) if p)

    @property
    def mcp(self) -> MCPRegistry | None:
        """The MCP servers (None before `start` or without an MCP config)."""
        return self._rt.mcp if self._rt is not None else None

    @property
    def skills(self) -> SkillManager | None:
        """The skill registry (None before `start` or without a skills folder)."""
        return self._rt.skills if self._rt is not None else None

    @property
    def data_dir(self) -> Path:
        """Folder of the embedded store."""
        return Path(self.config.store.data_dir)

    async def _ensure_open(self) -> Runtime:
        if self._closed:
            raise UsageError("this Agent was closed; create a new one")
        self._check_loop()
        if self._rt is None:
            if self._open_lock is None:
                self._open_lock = asyncio.Lock()
            async with self._open_lock:
                if self._rt is None:
                    rt = await Runtime.open(
                        self._layers,
                        self.tools,
                        http=self.http,
                        before_compact=self._before_compact,
                    )
                    if rt.config != self.config:  # values saved by config_set apply
                        self._assemble(rt.config)
                    self.governance.attach(rt.store)
                    self._services = self._run_services(rt)
                    if rt.mcp is not None:
                        rt.mcp.use_sampler(self._sample)
                    rt.store.journal.usage_day = self.quota.counting_day
                    self._rt = rt
                    await self.quota.prune_at_start()
                    await self._start_clock(rt)
        return self._rt

    async def _opened(self) -> tuple[Runtime, RunServices]:
        """The runtime and run services, opening the Agent first if needed."""
        rt = await self._ensure_open()
        assert self._services is not None
        return rt, self._services

    async def _start_clock(self, rt: Runtime) -> None:
        """Start the scheduler; a clock that cannot start leaves the agent usable and says why."""
        try:
            await self.clock.start(rt.store)
        except Exception:
            log.exception("the clock could not start: scheduled tasks will not fire")

    def _check_loop(self) -> None:
        """An Agent lives on the event loop it was first used on (its tasks and locks do)."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise UsageError(
                "this Agent is bound to the event loop it was first used on and cannot be used "
                "from another one (e.g. a second asyncio.run()); create one Agent per event loop"
            )

    def _run_services(self, rt: Runtime) -> RunServices:
        return RunServices(
            llm=rt.llm,
            window=rt.window,
            limits=RunLimits.from_config(self.config),
            gate=self._gate,
            after_tool=self.governance.after_tool,
            after_run=self._after_run,
            price=self.quota.cost,
            security=self.config.security,
            suspension=self._suspension,
            switch_model=self._quota_switch,
        )

    async def _quota_switch(self, spec: RunSpec) -> ModelSwitch | None:
        """``quota.fallback_model`` answers runs of a session whose daily quota is used up.

        Main and clock runs (the replies a person reads) carry the notice, once per session
        and day; subagents and team members switch silently.
        """
        fallback = await self.quota.fallback(spec.session)
        if fallback is None:
            return None
        session = spec.session

        async def noticed() -> None:
            await self.quota.noticed(session, fallback)

        return ModelSwitch(
            self._quota_clients.client(self.config),
            notice=fallback.notice if spec.kind in ("main", "clock") else "",
            noticed=noticed,
            reason=fallback.exhausted.message,
        )

    async def _count_embeddings(self, session: str, model: str, tokens: Tokens) -> None:
        """Count an embeddings endpoint's tokens for ``session`` (toward its quotas)."""
        await self.quota.add(session, {model: tokens})

    async def start(self) -> Agent:
        """Open the store, load skills and connect MCP servers now (else on the first chat).

        Waits until every MCP server has connected or failed; a chat that opens the agent does
        not wait for them (its servers join as they become ready).
        """
        rt = await self._ensure_open()
        if rt.mcp is not None:
            await rt.mcp.wait_started()
        return self

    async def _gate(self, call: ToolCall, ctx: Any) -> GateDecision | None:
        decision = await self.tool_gate(call, ctx) if self.tool_gate is not None else None
        if decision is None:
            await self._mark_side_effects(call, ctx)
        return decision

    async def _mark_side_effects(self, call: ToolCall, ctx: Any) -> None:
        """Note on the run record that a tool with side effects starts (before it runs).

        Recovery re-runs a turn a crash cut off (``runner.resume = "rerun"``) only without it.
        """
        run_id = ctx.run_state.get("run_id") if isinstance(ctx.run_state, dict) else None
        executor = ctx.executor
        tool = executor.get(call.name) if executor is not None else None
        if run_id is None or not has_side_effects(call.name, tool) or self._rt is None:
            return
        if not self.outbox.durable(ctx.session):  # no front end re-runs this session's turns
            return
        try:
            await self._rt.store.journal.mark_side_effects(run_id)
        except Exception:  # bookkeeping: the call still runs, the run will not be re-run
            log.exception("could not mark run %s as having side effects", run_id)

    async def _before_compact(self, history: list[Message]) -> None:
        if self.before_compact is not None:
            await self.before_compact(history)

    async def _after_run(self, spec: RunSpec, result: RunResult) -> None:
        await self.governance.after_run(spec.kind, spec.session, result, task=spec.text)

    def _builtin_session_tools(self, session: str) -> list[Tool]:
        """The clock_*, subagent_*, team_*, kb_* and memory_* tools (off with builtin_tools)."""
        if not self.config.agent.builtin_tools:
            return []
        from .knowledge.tools import knowledge_tools

        return [
            *self.clock.session_tools(session),
            *self.agents.session_tools(session),
            *knowledge_tools(self.knowledge, session, self.config),
        ]

    async def _turn_context(self, session: str, text: str) -> TurnContext | None:
        """The knowledge auto-injected into a main turn (None: nothing relevant, or off)."""
        if not self.config.agent.builtin_tools:
            return None
        from .knowledge.inject import auto_inject

        try:
            with charging(session):  # the query's embedding counts for the session
                found = await auto_inject(self.knowledge, session, text, self.config)
        except Exception:  # knowledge is an aid: a broken store must not stop the chat
            log.exception("auto-inject failed for %s", session)
            return None
        return None if found is None else TurnContext(found.block, found.event())

    def _new_session(self, name: str) -> Session:
        return Session(name, self._session_executor(name))

    def _session_executor(self, name: str) -> SessionToolExecutor:
        """A fresh tool table of a session: the shared tools and the session's own."""
        executor = SessionToolExecutor(self.tools)
        for factory in self._session_tools:
            for t in factory(name):
                executor.add(t, replace=True)
        return executor

    def session(self, name: str) -> Session:
        """The state of a session, created on first use.

        Idle sessions are evicted from memory (``agent.max_sessions``,
        ``agent.session_idle_seconds``); their history stays in the store.
        """
        if not name or not isinstance(name, str):
            raise UsageError(f"session must be a non-empty string, got {name!r}")
        return self.sessions.open(name)

    # ------------------------------------------------------------------ chat

    async def chat(
        self,
        text: str,
        session: str = "nb:default",
        callbacks: Callbacks | None = None,
        *,
        sender: str | None = None,
        images: Iterable[str] = (),
        model: str | None = None,
        plan: bool = False,
    ) -> RunResult:
        """Send a message and wait for the reply.

        ``model`` overrides the model and ``plan=True`` turns plan mode on for this run only.

        While the session is busy the message waits in its queue (up to ``agent.queue_size``;
        beyond that `SessionBusyError`) and is answered together with the other waiting ones.
        Cancelling this call withdraws only this message: queued, it is dropped; being
        answered, the run stops unless other callers' messages share it. A message starting with a
        command (``/stop``, ``/plan on``, ``/help``, a custom ``/name``) is routed first;
        ``sender`` identifies the user (admin rights; None is the trusted local user).
        """
        if not isinstance(text, str) or not text.strip():
            raise UsageError("chat() needs a non-empty message text")
        await self._ensure_open()
        state = self.session(session)
        command = parse_slash(text)
        if command is not None:
            routed = await self.governance.slash.route(session, *command, sender=sender)
            if routed.prompt is None:
                return RunResult(routed.reply or "", "success", session)
            text, images = routed.prompt, (*images, *routed.images)
        text, images = await self._with_mentions(text, tuple(images))
        pending = Pending(
            text,
            sender,
            tuple(images),
            callbacks or NO_CALLBACKS,
            asyncio.get_running_loop().create_future(),
            model,
            plan,
        )
        self._queues.submit(state, pending)
        try:
            return await asyncio.shield(pending.future)
        except asyncio.CancelledError:
            self._queues.withdraw(state, pending)
            raise

    # ------------------------------------------------------------------ durable front ends

    async def accept(self, inbound: Inbound, callbacks: Callbacks | None = None) -> Accepted:
        """Store an incoming event in the durable inbox, then queue or answer it.

        The inbox row is committed before anything else happens; an event whose key is
        already stored is ignored (``Accepted.state == "duplicate"``) so a re-sent event is
        never answered twice. Its reply goes to the durable outbox (`Outbox.serve`), nobody
        awaits it. ``callbacks`` serve the run (default: ``outbox.callbacks_for(session)``).
        See `ania_nb.orchestration.inbox`.
        """
        if inbound.kind != "ignored" and not inbound.text.strip():
            raise UsageError("accept() needs a non-empty message text")
        if not inbound.session or not isinstance(inbound.session, str):
            raise UsageError(f"session must be a non-empty string, got {inbound.session!r}")
        store = (await self._ensure_open()).store
        inbox_id = await store.inbox.accept(inbound.row())
        if inbox_id is None:
            log.debug(
                "%s: event %s/%s/%s was accepted before; ignored",
                inbound.session,
                inbound.source,
                inbound.account,
                inbound.key,
            )
            return Accepted(None, "duplicate")
        claims = self._claims
        if claims is not None and claims.shared:
            return await self._accept_shared(claims, inbox_id, inbound, callbacks)
        if inbound.kind == "ignored":
            return Accepted(inbox_id, "ignored")
        if inbound.kind == "approval":
            return Accepted(inbox_id, "stored")
        if not self._accepting:
            return Accepted(inbox_id, "held")
        return await self._dispatch(inbox_id, inbound, callbacks)

    async def _accept_shared(
        self,
        claims: SessionClaims,
        inbox_id: int,
        inbound: Inbound,
        callbacks: Callbacks | None,
    ) -> Accepted:
        """A stored event when replicas share the store: dispatched only under its session's claim.

        Held here: dispatched at once. Free: claimed, and the session's pending rows (this one
        included) dispatched in order. Held by another replica: that one is told and answers it.
        Rows nobody dispatches now (unaddressed, or stored while shutting down) are announced
        too: the holder may be waiting for exactly that verdict, or the sweep takes them.
        """
        replica, session = claims.replica, inbound.session
        if inbound.kind in ("ignored", "approval") or not self._accepting:
            if not replica.held(session) or not self._accepting:
                await replica.notify(session, inbox_id)
            state = {"ignored": "ignored", "approval": "stored"}.get(inbound.kind, "held")
            return Accepted(inbox_id, state)  # type: ignore[arg-type]
        if replica.hold(session):
            try:
                if not claims.dispatching(session, inbox_id):
                    return Accepted(inbox_id, "queued")  # a pull here took it first
                return await self._dispatch(inbox_id, inbound, callbacks)
            finally:
                await replica.release(session)
        if await claims.take(session):
            return Accepted(inbox_id, "queued")
        await replica.notify(session, inbox_id)
        return Accepted(inbox_id, "deferred")

    async def _dispatch(
        self,
        inbox_id: int,
        inbound: Inbound,
        callbacks: Callbacks | None,
        *,
        recovered: bool = False,
    ) -> Accepted:
        """Route a stored command, or queue a stored message (``recovered``: past the limit)."""
        session, text, images = inbound.session, inbound.text, tuple(inbound.images)
        state = self.session(session)
        command = parse_slash(text) if inbound.kind == "command" else None
        if command is not None:
            routed = await self.governance.slash.route(session, *command, sender=inbound.sender)
            if routed.prompt is None:
                reply = routed.reply or ""
                await self._answer_now(session, inbox_id, reply)
                return Accepted(inbox_id, "answered", reply=reply)
            text, images = routed.prompt, (*inbound.images, *routed.images)
        if inbound.kind in ("message", "command"):
            text, images = await self._with_mentions(text, images)
        pending = Pending(
            text,
            inbound.sender,
            images,
            callbacks or self.outbox.callbacks_for(session),
            asyncio.get_running_loop().create_future(),
            inbound.model,
            inbound.plan,
            role=stored_role(inbound),  # a background result: the role of whoever started it
            inbox_id=inbox_id,
            meta=inbound.meta,
        )
        if not self._queues.offer(state, pending, limit=not recovered):
            await (await self._ensure_open()).store.inbox.update(
                [InboxState((inbox_id,), "dropped")]
            )
            return Accepted(inbox_id, "dropped")
        return Accepted(inbox_id, "queued")

    async def _sample(self, request: SamplingRequest, ctx: ToolContext) -> SampledReply:
        """An MCP server's sampling request: a person approves it, then the model answers.

        In a notebook the local user approves; in a chat only an admin does, unless
        ``mcp.sampling_requester_approves`` lets the requester. The tokens go to the run's usage.
        """
        from .engine.usage import Usage
        from .mcp.sampling import SampledReply, describe_request

        rt = await self._ensure_open()
        settings = self.config.mcp
        model = _sampling_model(request.hints, [settings.sampling_model, rt.llm.model])
        admin_only = ctx.admin_only_approval or (
            ctx.sender is not None and not settings.sampling_requester_approves
        )
        verdict = await self.governance.approvals.request(
            session=ctx.session,
            tool=f"mcp_sampling_{request.server}"[:64],
            summary=f"MCP server '{request.server}' asks {model} for a completion",
            details=describe_request(request, model),
            callbacks=ctx.callbacks,
            requester=ctx.sender,
            requesters=ctx.requesters,
            admin_only=admin_only,
            call_id=ctx.call_id,
        )
        if not verdict.allowed:
            raise ToolError(
                f"the sampling request of MCP server '{request.server}' was not approved"
                + (f": {verdict.reason}" if verdict.reason else "")
            )
        client = await rt.llm.with_model(model)  # a copy: its limits are this request's
        client.max_tokens = request.max_tokens
        if request.temperature is not None:
            client.temperature = request.temperature
        messages = [{"role": "system", "content": request.system_prompt}] * bool(
            request.system_prompt
        ) + [{"role": role, "content": text} for role, text in request.messages]
        try:
            completion = await client.complete(messages)
        except LLMError as exc:
            raise ToolError(f"the model could not answer the sampling request: {exc}") from None
        usage = ctx.run_state.get("usage")
        if not isinstance(usage, Usage):  # outside a run: still the session's tokens
            usage = Usage()
            self.host.add_derived_usage(ctx.session, usage)
        usage.add_completion(completion, messages, count_iteration=False)
        text = completion.message.get("content") or ""
        stop = "maxTokens" if completion.finish_reason == "length" else "endTurn"
        return SampledReply(str(text), completion.asked or completion.model, stop)

    async def _with_mentions(
        self, text: str, images: tuple[str, ...]
    ) -> tuple[str, tuple[str, ...]]:
        """``@server:uri`` mentions in a user's message: the resources read and attached."""
        registry = self.mcp
        if registry is None or "@" not in text:
            return text, images
        from .mcp.mentions import attach_mentions

        attached = await attach_mentions(registry, text)
        return attached.text, (*images, *attached.images)

    async def _queue_stored(self, inbox_id: int, inbound: Inbound) -> bool:
        """Queue a message the Agent's own work stored (`AgentHost.queue_stored`)."""
        if self._closed or not self._accepting:
            return False  # stored: answered after the restart (`recover`)
        accepted = await self._dispatch(inbox_id, inbound, None, recovered=True)
        return accepted.state == "queued"

    async def _answer_now(self, session: str, inbox_id: int, reply: str) -> None:
        """A command's answer: an outbox row answering its inbox row, in one transaction."""
        if self.outbox.durable(session):
            delivery = Delivery(session, reply, "command", title="command")
            await self.outbox.post(delivery, kind="command", answers=(inbox_id,))
        else:
            store = (await self._ensure_open()).store
            await store.inbox.update([InboxState((inbox_id,), "answered")])

    def stop_accepting(self) -> None:
        """A front end shuts down: events accepted from now on are stored, not queued.

        They are answered after the restart (`recover`); messages already queued are still
        answered, and a stop leaves queued messages in the inbox instead of dropping them.
        """
        self._accepting = False

    @property
    def closed(self) -> bool:
        """Whether `aclose` was called."""
        return self._closed

    @property
    def settled(self) -> bool:
        """Whether every answered batch's inbox rows are settled (no store write pending)."""
        return not self._settling

    @property
    def accepting(self) -> bool:
        """Whether accepted events are queued (False once `stop_accepting` was called)."""
        return self._accepting

    async def serve_replica(
        self,
        replica_id: str = "",
        *,
        callbacks_of: Callable[[InboxEntry], Callbacks] | None = None,
        route_stored: Callable[[InboxEntry], Awaitable[bool]] | None = None,
    ) -> Replica:
        """Serve the durable inbox as one replica of the store (a front end calls it at start).

        On PostgreSQL the process joins the replicas answering the store's sessions under
        ``replica_id`` (default host:pid; `StoreError` when a live replica uses it): each
        session is answered by one replica at a time (`ania_nb.orchestration.claims`). On SQLite
        the process is the only replica. Either way, runs left ``running`` by dead processes
        are swept periodically once `recover` ran. ``callbacks_of(entry)`` gives a stored row's
        run its callbacks; ``route_stored(entry)`` lets the front end answer a row stored by
        another replica itself (True: answered, e.g. a verdict on an approval waiting here).
        """
        rt = await self._ensure_open()
        self._callbacks_of = callbacks_of
        self._route_stored = route_stored
        if self._claims is None:
            replica = await open_replica(rt.store.db, replica_id)
            self._claims = SessionClaims(
                replica,
                rt.store,
                self.sessions,
                dispatch=self._dispatch_stored,
                route_ignored=self._route_ignored,
                recover_session=self._recover_session,
                settled=self._wait_settled,
                dead_work=self._dead_work,
                wake_outbox=self.outbox.woken,
            )
            replica.on_notified(self._claims.notified)
        return self._claims.replica

    @property
    def replica(self) -> Replica | None:
        """The process as a replica of the store, once `serve_replica` was called."""
        return None if self._claims is None else self._claims.replica

    async def recover(
        self, callbacks_of: Callable[[InboxEntry], Callbacks] | None = None
    ) -> Recovery:
        """Answer what a previous process left in the durable inbox and outbox (call at start).

        Outbox rows a dead process left ``sending`` become ``uncertain`` (never sent again) and
        pending rows are sent, once a deliverer serves them. Inbox rows whose run a crash cut
        off are re-run (``runner.resume = "rerun"``, only if no tool with side effects had
        started in that run) or announced with one notice per chat (``"notify"``); their run
        records say which. Background subagents whose process died end ``interrupted``, each
        with one notice to its chat. Then every pending row is queued again in order, batched
        per session (background results included). With replicas (`serve_replica`) only what
        dead processes left is touched, each session under its claim, and the periodic sweep
        starts.
        ``callbacks_of(entry)`` gives a row's run its callbacks (default: the outbox's).
        """
        if callbacks_of is not None:
            self._callbacks_of = callbacks_of
        store = (await self._ensure_open()).store
        uncertain = await self.outbox.deliverer.start() if self.outbox.deliverer else []
        window = self.config.runner.inbox_window
        await store.inbox.prune(window)
        await store.outbox.prune(window)
        await store.children.prune(window)
        children = await self._interrupt_orphaned_children()
        claims = self._claims
        if claims is not None and claims.shared:
            before = (self._recovered.rerun, self._recovered.notified)
            await claims.sweep(age=0.0, dead=False)
            claims.start()
            self._start_upkeep()
            return Recovery(
                claims.taken_over,
                self._recovered.rerun - before[0],
                self._recovered.notified - before[1],
                len(uncertain),
                children,
            )
        rerun = notified = 0
        orphans = await self._orphans()
        for session in dict.fromkeys(entry.session for entry, _ in orphans):
            counted = await self._resolve_orphans(
                session, [(e, side) for e, side in orphans if e.session == session]
            )
            rerun, notified = rerun + counted[0], notified + counted[1]
        queued = 0
        for entry in await store.inbox.list(states=["pending"]):
            await self._dispatch_stored(entry)
            queued += entry.kind != "approval"
        if claims is not None:
            claims.start()
            self._start_upkeep()
        return Recovery(queued, rerun, notified, len(uncertain), children)

    def _start_upkeep(self) -> None:
        if self._upkeeper is None:
            self._upkeeper = asyncio.create_task(self._upkeep_forever(), name="ania-kb-upkeep")

    async def _upkeep_forever(self) -> None:
        """The served Agent that holds the clock compacts and indexes the knowledge, for all.

        Replicas share one knowledge location; one of them (the clock's leader) does the upkeep
        every `KB_UPKEEP_SECONDS`. Each process still compacts after many writes of its own.
        """
        while True:
            await asyncio.sleep(KB_UPKEEP_SECONDS)
            if not self.clock.active or not self.knowledge.exists():
                continue
            try:
                await self.knowledge.upkeep()
            except Exception:
                log.exception("the knowledge upkeep failed (tried again later)")

    async def _orphans(self, session: str | None = None) -> list[tuple[InboxEntry, bool]]:
        """Inbox rows whose run a crash cut off (of ``session``), with "side effects started".

        A run that waits for an approval is not cut off: its card is posted again and the
        verdict continues it (`resume_approvals`), which answers its rows.
        """
        store = (await self._ensure_open()).store
        waiting = {row.run_id for row, _ in await store.approvals.open_rows()}
        return [
            (e, side)
            for e, side in await store.inbox.orphans()
            if e.run_id not in waiting and (session is None or e.session == session)
        ]

    async def _resolve_orphans(
        self, session: str, rows: list[tuple[InboxEntry, bool]]
    ) -> tuple[int, int]:
        """Re-run or announce one session's cut-off rows; returns (re-run, announced) counts."""
        store = (await self._ensure_open()).store
        ids = tuple(e.id for e, _ in rows)
        runs = tuple(dict.fromkeys(e.run_id for e, _ in rows if e.run_id is not None))
        if self.config.runner.resume == "rerun" and not any(side for _, side in rows):
            await store.inbox.resume(ids, runs, "rerun")
            log.info("%s: re-running %d message(s) a restart cut off", session, len(ids))
            self._recovered.rerun += len(ids)
            return len(ids), 0
        notice = None
        if self.outbox.durable(session):
            language = language_for(self.config.ui.language, session)
            notice = restart_notice(session, [e for e, _ in rows], language)
        await store.inbox.resume(ids, runs, "notified", notice)
        log.info("%s: told the chat that %d repl(ies) were cut off", session, len(ids))
        self.outbox.woken(session)
        self._recovered.notified += len(ids)
        return 0, len(ids)

    async def _recover_session(self, session: str) -> None:
        """Under the session's claim: resolve the rows a dead replica's run left."""
        rows = await self._orphans(session)
        if rows:
            await self._resolve_orphans(session, rows)

    async def _dispatch_stored(self, entry: InboxEntry) -> None:
        """Queue or answer a stored row (recovered, or stored by another replica)."""
        store = (await self._ensure_open()).store
        if entry.kind == "approval":  # its approval died with the process (see its run)
            await store.inbox.update([InboxState((entry.id,), "ignored")])
            return
        if self._route_stored is not None and await self._route_stored(entry):
            return
        callbacks = self._callbacks_of(entry) if self._callbacks_of is not None else None
        await self._dispatch(entry.id, inbound_of(entry), callbacks, recovered=True)

    async def _route_ignored(self, entry: InboxEntry) -> bool:
        """A row stored without an answer (unaddressed): the front end's say on it, if any."""
        return self._route_stored is not None and await self._route_stored(entry)

    def _worker_started(self, state: Session) -> None:
        if self._claims is not None and self._claims.shared:
            self._claims.worker_started(state)

    async def _worker_idle(self, state: Session) -> bool:
        if self._claims is None or not self._claims.shared:
            return False
        try:
            return await self._claims.worker_idle(state)
        except Exception:
            log.exception("%s: releasing the session's claim failed", state.name)
            return False

    async def _wait_settled(self) -> None:
        """Until every answered batch's inbox rows are settled in the store."""
        if self._settling:
            await asyncio.gather(*list(self._settling), return_exceptions=True)

    async def _dead_work(self) -> None:
        """What dead processes left besides inbox rows: sending rows, background subagents."""
        store = (await self._ensure_open()).store
        for entry in await store.outbox.recover():
            log.warning(
                "outbox row %d to %s was being sent by a process that died; not sent again",
                entry.id,
                entry.session,
            )
        await self._interrupt_orphaned_children()

    async def _interrupt_orphaned_children(self) -> int:
        """End ``interrupted`` the subagents whose process died; returns how many chats heard.

        A background child of a durable session gets its chat's notice in the transaction that
        ends its row, so exactly one process tells the chat, once. A synchronous child ended
        with its parent's run (whose own recovery speaks for it).
        """
        store = (await self._ensure_open()).store
        told = 0
        for row in await store.children.orphans():
            notice = []
            if row.background and self.outbox.durable(row.session):
                language = language_for(self.config.ui.language, row.session)
                notice = [stopped_notice(row.session, row.id, "interrupted", language)]
            if await store.children.end(row.id, "interrupted", "restart", notice) and notice:
                log.info("%s: background subagent %d was cut off by a restart", row.session, row.id)
                told += 1
                self.outbox.woken(row.session)
        return told

    async def _answered_by_resumed_run(self, session: str, original_run: int | None) -> None:
        """The inbox rows of a run that waited for an approval are answered by its continuation.

        Until then they stay ``running`` (recovery leaves them alone while the approval is open,
        so the chat gets the re-sent card, not a "cut off" notice as well).
        """
        if original_run is None or self._rt is None:
            return
        inbox = self._rt.store.inbox
        rows = await inbox.list(states=["running"], session=session)
        ids = tuple(e.id for e in rows if e.run_id == original_run)
        if ids:
            await inbox.update([InboxState(ids, "answered")])

    def _batch_finished(self, state: Session, batch: list[Pending], result: RunResult) -> None:
        """Settle a batch's inbox rows that its run did not (a refusal, a stop before it began)."""
        ids = tuple(p.inbox_id for p in batch if p.inbox_id is not None and not p.settled)
        if not ids or self._rt is None:  # the run's finish step answered them (the usual case)
            return  # and handed its reply row to the outbox (`Outbox.handoff`)
        row = reply_row(state.name, batch, result, shutdown=not self._accepting)
        self._track(self._settle(state.name, ids, row))

    async def _settle(self, session: str, ids: tuple[int, ...], row: OutboxRow) -> None:
        assert self._rt is not None
        try:
            await self._rt.store.inbox.settle(ids, row)
        except Exception:
            log.exception("could not settle inbox rows %s of %s", ids, session)
        self.outbox.woken(session)

    def _batch_dropped(self, state: Session, dropped: list[Pending]) -> None:
        """A stop dropped queued messages: ``dropped`` rows (kept pending while shutting down)."""
        ids = tuple(p.inbox_id for p in dropped if p.inbox_id is not None)
        if ids and self._accepting and self._rt is not None:
            store = self._rt.store
            self._track(store.inbox.update([InboxState(ids, "dropped")]))

    def _track(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(work)
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    def stop(self, session: str = "nb:default") -> bool:
        """Cancel the session's running request, its queue and background work.

        Returns False when nothing was running.
        """
        stopped_background = self.host.stop(session)  # clock runs, background subagents
        # Approvals asked again after a restart have no run yet: a stop ends them too.
        stopped_approvals = self.approvals.cancel(session) > 0
        return self._queues.stop(session) or stopped_background or stopped_approvals

    def answer_approval(
        self,
        request_id: str | None = None,
        *,
        session: str | None = None,
        allow: bool | str,
        approver: str | None = None,
        reason: str = "",
    ) -> ApprovalRequest:
        """Answer a pending tool approval (by id, or the session's one).

        ``allow`` is a bool or an answer word (允许/同意/批准/allow/approve/yes/y or
        拒绝/deny/reject/no/n). Pending requests reach the front end via ``request_approval``.
        """
        return self.approvals.answer(
            request_id, session=session, allow=allow, approver=approver, reason=reason
        )

    async def answer_suspended(
        self,
        request_id: str | None = None,
        *,
        session: str | None = None,
        allow: bool | str,
        approver: str | None = None,
        reason: str = "",
    ) -> ApprovalRequest:
        """Answer an approval suspended by this shutdown (`suspend_approvals`); returns it.

        For a front end still taking messages during its shutdown grace: the same words and
        rules as `answer_approval`, but the verdict is kept on the stored request and the next
        start continues the run with it (`resume_approvals`) instead of posting the card again.
        Suspended requests of a session are ``approvals.suspended(session)``.
        """
        return await self.approvals.answer_suspended(
            request_id, session=session, allow=allow, approver=approver, reason=reason
        )

    # ------------------------------------------------------------------ approvals across restarts

    # ------------------------------------------------------------------ background work

    @property
    def background_running(self) -> int:
        """How many background subagents are still running (all sessions)."""
        return self.agents.subagents.background_running

    async def stop_background(self) -> int:
        """Stop every background subagent still running, as a restart does; returns how many.

        Each one's row ends ``stopped`` with one notice to its chat ("background task N was
        stopped by a restart") in the same transaction: sent now if the front end is connected,
        else after the restart. The runner calls this when its grace period ends; `aclose`
        does for what is left.
        """
        return await self.agents.subagents.stop_background()

    async def suspend_approvals(self) -> int:
        """Suspend every run blocked only on an approval, now and from now on (shutdown).

        Such a run ends at once: its record ``interrupted`` ("suspended waiting for an
        approval"), no tool result written, the approval's row ``suspended``; a run that
        becomes blocked so later is suspended then. `resume_approvals` (the next start) asks
        again. `aclose` calls this first; returns how many runs were suspended now.
        """
        suspended = self._suspension.begin()
        if suspended:
            await asyncio.wait(suspended)
        return len(suspended)

    async def resume_approvals(self) -> list[ApprovalRequest]:
        """Ask again the approvals a restart left open; returns the requests posted again.

        Each stored request that is ``suspended``, or ``pending`` with its process gone, is
        claimed (never by two processes), registered under the same id and posted again
        through ``outbox.callbacks_for(session)``'s ``request_approval`` (``resent`` set), for
        what is left of its original deadline. The verdict — `answer_approval`, same rules —
        queues a resumed run in the session (`answer_resumed`): the pending call runs (allowed)
        or gets the refusal as its result (denied, timed out), and the loop goes on; the reply
        is published on the outbox. A request whose deadline passed is not posted: it times
        out at once and its run goes on with the refusal; nor is one answered during the last
        shutdown (`answer_suspended`): its run goes on with that verdict. Requests of sessions
        this front end cannot ask in (no ``request_approval``) are left for one that can.
        Ended rows older than a week are pruned first.
        """
        rt = await self._ensure_open()
        approvals = rt.store.approvals
        await approvals.prune(APPROVAL_ROWS_KEPT)
        asked = {r.id for r in self.approvals.pending()}
        posted: list[ApprovalRequest] = []
        decided = 0
        replica = self.replica if self.replica is not None and self.replica.shared else None
        for row, live in await approvals.open_rows():
            callbacks = self.outbox.callbacks_for(row.session)
            if live or row.id in asked or not callbacks.has("request_approval"):
                continue
            # Replicas: the request waits where its session is claimed, so that a verdict any
            # replica stores reaches it (its holder is told); released when its run is queued.
            if replica is not None and not await replica.claim(row.session):
                continue  # another replica answers the session now: asked at the next start
            claimed = await approvals.claim(row)
            if claimed is None:  # another process took it over meanwhile
                if replica is not None:
                    await replica.release(row.session)
                continue
            try:
                request = request_from_record(claimed.id, claimed.session, claimed.request)
                Resumption.from_checkpoint(  # checked now: a broken row is said at once
                    claimed.id, claimed.checkpoint, Verdict(True), admin_only=request.admin_only
                )
            except UsageError as exc:
                log.warning("approval %s cannot be resumed: %s", claimed.id, exc)
                await approvals.settle(claimed.id, "error", str(exc))
                if replica is not None:
                    await replica.release(row.session)
                continue
            task = asyncio.create_task(
                self._continue_approval(claimed, request, callbacks, replica),
                name=f"ania-approval-{claimed.id}",
            )
            self._resumed.add(task)
            task.add_done_callback(self._resumed.discard)
            if claimed.verdict is not None:
                decided += 1
            elif not claimed.expired:
                posted.append(request)
        if posted:
            log.info("asked again %d approval(s) left open by a restart", len(posted))
        if decided:
            log.info("continuing %d run(s) with the verdict given during the shutdown", decided)
        return posted

    async def _continue_approval(
        self,
        row: ApprovalRow,
        request: ApprovalRequest,
        callbacks: Callbacks,
        replica: Replica | None = None,
    ) -> None:
        """Wait for the verdict on a re-posted request, then queue its run's continuation.

        The row is settled when the resumed run starts (`_answer`): closed before that, the
        Agent leaves it ``suspended``, to be asked again after the next start. ``replica``: the
        session's claim, held until then.
        """
        try:
            await self._resume_approval(row, request, callbacks)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug must not leave a task exception nobody retrieves
            log.exception("approval %s could not be continued", row.id)
        finally:
            if replica is not None:
                await asyncio.shield(replica.release(row.session))

    async def _resume_approval(
        self, row: ApprovalRow, request: ApprovalRequest, callbacks: Callbacks
    ) -> None:
        # Answered while the last process shut down: no card, the run goes on with it.
        verdict = stored_verdict(row)
        if verdict is None:
            verdict = await self.approvals.resume(request, callbacks, deadline=row.deadline)
        if verdict.outcome not in VERDICT_OUTCOMES:  # /stop (settled): the run stays where it was
            return
        resumption = Resumption.from_checkpoint(
            row.id, row.checkpoint, verdict, admin_only=request.admin_only
        )
        state = self.session(row.session)
        pending = Pending(
            resumption.text,
            resumption.sender,
            (),
            callbacks,
            asyncio.get_running_loop().create_future(),
            resumption.model,
            resumption.plan_mode,
            synthetic=True,  # nobody awaits it: the reply is published
            role=resumption.role,
            resume=resumption,
        )
        self._queues.offer(state, pending)
        try:
            await asyncio.shield(pending.future)
        except asyncio.CancelledError:  # closing before the resumed run started: ask again later
            if pending in state.queue:
                state.queue.remove(pending)
                suspended = Verdict(False, SUSPENDED, None, "suspended")
                await asyncio.shield(self.approvals.settle(row.id, suspended))
            raise

    async def _answer(self, state: Session, batch: list[Pending]) -> RunResult:
        resume = batch[0].resume
        if resume is not None and self._closed:  # its turn came while closing: ask again later
            await self.approvals.settle(
                resume.request_id, Verdict(False, SUSPENDED, None, "suspended")
            )
            return RunResult("", "stopped", state.name, error=SUSPENDED)
        rt, services = await self._opened()
        if resume is not None:
            await self.approvals.settle(resume.request_id, resume.verdict)  # the run goes on now
            result = await answer_resumed(
                state,
                batch[0],
                governance=self.governance,
                services=services,
                store=rt.store,
                system_prompt=self.system_prompt,
                run_timeout=self.config.agent.run_timeout,
            )
            await self._answered_by_resumed_run(state.name, resume.original_run)
            return result
        return await answer_batch(
            state,
            batch,
            governance=self.governance,
            services=services,
            store=rt.store,
            system_prompt=self.system_prompt,
            run_timeout=self.config.agent.run_timeout,
            context=self._turn_context,
            admit=self._quota_denial,
            shutting_down=lambda: not self._accepting,
            outbox=self.outbox,
        )

    async def _quota_denial(self, session: str) -> str | None:
        """Why new work for ``session`` is refused today (a daily token quota), or None."""
        denial = await self.quota.check(session)
        return denial.message if denial is not None else None

    def _publish_reply(self, state: Session, batch: list[Pending], result: RunResult) -> None:
        """Publish the reply to injected messages (nobody awaits it) on the outbox."""
        source = "approval" if batch[0].resume is not None else batch[0].sender or "synthetic"
        self.outbox.publish_soon(reply_delivery(state.name, source, result))

    # ------------------------------------------------------------------ records

    async def history(self, session: str = "nb:default") -> list[Message]:
        """The stored conversation of a session (images as ``[image <hash8>]`` markers)."""
        store = (await self._ensure_open()).store
        return await store.history.load(session)

    async def clear_history(self, session: str = "nb:default") -> int:
        """Forget a session's conversation; returns the number of messages removed."""
        store = (await self._ensure_open()).store
        removed = await store.history.clear(session)
        state = self.sessions.get(session)
        if state is not None:
            state.conversation = Conversation()
        return removed

    async def runs(
        self,
        *,
        session: str | None = None,
        status: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
    ) -> list[RunRecord]:
        """Recent run records, newest first, filtered by session, status and start time."""
        store = (await self._ensure_open()).store
        return await store.runs.list(
            session=session, status=status, since=since, until=until, limit=limit
        )

    # ----------------------------------------------------------------- close

    async def aclose(self) -> None:
        """Stop every session, close model connections and the store; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.host.close()  # background work reports into a closing agent no more
        await self.clock.aclose()  # no task fires into a closing agent
        # Runs blocked only on an approval are suspended (asked again after a restart), not
        # stopped; so are approvals asked again that are still open.
        await self.suspend_approvals()
        for task in list(self._resumed):
            task.cancel()
        if self._resumed:
            await asyncio.gather(*self._resumed, return_exceptions=True)
        await self.stop_background()  # before the stops below: a restart, not the user's /stop
        for state in self.sessions:
            self.stop(state.name)  # background work too
        await self._queues.aclose()
        if self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)
        await self.agents.aclose()
        await self.knowledge.aclose()
        await self._quota_clients.aclose()
        if self._upkeeper is not None:
            self._upkeeper.cancel()
            await asyncio.gather(self._upkeeper, return_exceptions=True)
        if self._claims is not None:
            await self._claims.aclose()
            await self._claims.replica.close()
        if self._rt is not None:
            await self._rt.aclose()
        for viewer in self._viewers:
            if viewer.describer is not None:
                await viewer.describer.aclose()
        await self._web.aclose()

    async def __aenter__(self) -> Agent:
        """Open the store eagerly; `aclose` on exit."""
        await self._ensure_open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close everything."""
        await self.aclose()


def _sampling_model(hints: tuple[str, ...], configured: list[str]) -> str:
    """The model for a sampling request: the first configured one a server's hint names.

    ``configured`` is in preference order (``mcp.sampling_model``, then the main model); a
    hint matches a model whose name contains it (``"claude"`` names ``"claude-3-haiku"``).
    Without a matching hint the first configured model answers.
    """
    models = [m for m in configured if m]
    for hint in hints:
        for model in models:
            if hint.strip() and hint.strip().lower() in model.lower():
                return model
    return models[0]
