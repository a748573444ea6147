"""Config sections: one pydantic model per group of keys, each key with a default and meaning."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from .._env import DEFAULT_SECRET_ENV
from ._locations import check_store_url, store_backend


def _secret(description: str) -> Any:
    """A sensitive field: masked whenever shown."""
    return Field(default=None, description=description, json_schema_extra={"sensitive": True})


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Endpoint(Section):
    """Where a model role sends its requests; each role says what its empty fields mean.

    The keys stay flat (``vision.base_url``, not ``vision.endpoint.base_url``); `resolved` is
    the one place that fills a role's empty fields with the main model's.
    """

    base_url: str = Field("", description="Endpoint base URL; empty = the main model's.")
    api_key: SecretStr | None = _secret("API key; empty = the main model's.")
    model: str = Field("", description="Model name; empty = the main model's.")

    @field_validator("base_url", check_fields=False)
    @classmethod
    def _empty_or_http_url(cls, value: str) -> str:
        """An ``http(s)://host…`` address, or empty; refused when set, not blamed later on a key."""
        text = value.strip()
        if not text:
            return text
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "must be an http:// or https:// address such as http://127.0.0.1:8080/v1, or empty"
            )
        return text

    def resolved(self, main: Endpoint) -> ResolvedEndpoint:
        """The role's endpoint with every empty (or blank) field taken from ``main``."""
        own_key = _secret_text(self.api_key)
        return ResolvedEndpoint(
            base_url=self.base_url.strip() or main.base_url.strip(),
            api_key=own_key or _secret_text(main.api_key) or None,
            model=self.model.strip() or main.model.strip(),
        )


@dataclass(frozen=True)
class ResolvedEndpoint:
    """A role's endpoint with the main model's values filled in (the key in the clear)."""

    base_url: str
    api_key: str | None = field(repr=False)
    model: str


def _secret_text(secret: SecretStr | None) -> str:
    return secret.get_secret_value().strip() if secret is not None else ""


class LLMSettings(Endpoint):
    """The main chat model (any OpenAI-compatible Chat Completions endpoint)."""

    base_url: str = Field(
        "",
        description="Endpoint base URL, e.g. http://127.0.0.1:8080/v1 (usually ends in /v1); "
        "required: there is no default vendor.",
    )
    api_key: SecretStr | None = _secret(
        "API key sent as a Bearer token; a server on this machine or a private network may "
        "need none."
    )
    model: str = Field("", description="Model name; required: there is no default model.")
    temperature: float | None = Field(
        None, description="Sampling temperature; unset = provider default."
    )
    top_p: float | None = Field(None, description="Nucleus sampling; unset = provider default.")
    max_tokens: int | None = Field(
        4096,
        gt=0,
        description=(
            "Completion token cap per call (a reply cut there ends the run as an error); "
            "4096 fits a long answer and stops a runaway local model within minutes."
        ),
    )
    timeout: float = Field(120.0, gt=0, description="Seconds one HTTP request may take.")
    stream: bool = Field(True, description="Stream replies so front ends can show text live.")
    cut_repeats: int = Field(
        10,
        ge=0,
        description=(
            "Cut a reply that writes the same line or block of lines this many times in a row "
            "(a runaway small model), with a notice; 0 = never."
        ),
    )
    text_tool_calls: bool | Literal["auto"] = Field(
        "auto",
        description=(
            "Run tool calls a model writes as text instead of sending tool_calls (<tool_call> "
            'or <tools> tags, <function=…> blocks, fenced or bare JSON {"name", "arguments"}): '
            '"auto" when tools were offered and the answer ends with such calls (only calls, '
            "or the model's words then calls), for any endpoint; true whenever they appear; "
            "false never (an answer that is only such a call then ends as an error). Small "
            "local models do this often, also behind llama-server --jinja."
        ),
    )


class FallbackSettings(Endpoint):
    """The model tried once when the main one fails; empty fields are the main model's."""

    model: str = Field("", description="Model name; empty = no fallback.")


class CompressorSettings(Endpoint):
    """The model that summarises long histories; empty fields are the main model's."""

    model: str = Field("", description="Model name; empty = the main model summarises.")


class RetrySettings(Section):
    """Retries on 429, 5xx and network errors, with base·2ⁿ backoff (capped) plus jitter."""

    max_attempts: int = Field(
        3, ge=1, le=10, description="Attempts per model call, first included."
    )
    base_delay: float = Field(2.0, ge=0, description="Seconds before the first retry.")
    max_delay: float = Field(30.0, ge=0, description="Cap on one backoff delay, before jitter.")
    on_timeout: bool = Field(
        False,
        description=(
            "Retry a non-streamed call that timed out; off: a local server may still be "
            "working on the first request, so the timeout is an error at once."
        ),
    )


class AgentSettings(Section):
    """Limits of one agent run."""

    max_iterations: int = Field(20, ge=1, le=200, description="LLM rounds before the final answer.")
    max_context_tokens: int = Field(
        128000, ge=0, description="Context budget; 0 disables compression."
    )
    compress_ratio: float = Field(
        0.8, gt=0, lt=1, description="Compress history above this share of the budget."
    )
    run_timeout: float = Field(300.0, gt=0, description="Seconds one chat request may take.")
    queue_size: int = Field(
        20, ge=0, le=1000, description="Messages a busy session queues before refusing."
    )
    system_prompt: str = Field("", description="System prompt; empty = the built-in prompt.")
    builtin_tools: bool = Field(
        True,
        description=(
            "Register the built-in tools (time, web, meme, images, gated tools, todo, clock_*, "
            "subagent_*, team_*)."
        ),
    )
    max_repeat_calls: int = Field(
        3,
        ge=0,
        le=100,
        description=(
            "Identical calls (same tool, same arguments, same result) run per request; a "
            "further one is not run and the model is told the earlier result. 0 = no limit."
        ),
    )
    max_tool_result_chars: int = Field(
        20000,
        ge=1000,
        description="Longer tool results are cut before the model sees them (protects context).",
    )
    max_sessions: int = Field(
        1000,
        ge=1,
        description="Sessions kept in memory; the least recently used idle ones are evicted "
        "(their history stays in the store).",
    )
    session_idle_seconds: float = Field(
        3600.0, gt=0, description="An idle session is evicted from memory after this long."
    )


class StoreSettings(Section):
    """The store: SQLite in the data directory, or a PostgreSQL server (``store.url``)."""

    data_dir: Path = Field(Path(".ania"), description="Folder for the database and vectors.")
    url: SecretStr | None = Field(
        default=None,
        description="Where the store lives: empty = SQLite in store.data_dir; "
        "postgresql://user@host:5432/dbname (or postgres://) = that PostgreSQL server (the "
        "postgres extra). Give the password in the URL through ANIA_STORE__URL, or keep it "
        "out of the URL in a PGPASSFILE / ~/.pgpass; the password is masked wherever shown.",
        json_schema_extra={"sensitive": "url"},
    )
    run_log_max_entries: int = Field(
        10_000,
        ge=1,
        description="Run records kept in all; past it, records go from the sessions holding "
        "the most (their oldest first), so one busy chat cannot evict the others'.",
    )
    run_log_max_per_session: int = Field(
        200,
        ge=1,
        description="Run records kept per session (its oldest evicted); token counting "
        "does not depend on it.",
    )
    sync_interval: float = Field(
        2.0,
        gt=0,
        description="Seconds between checks for MCP servers and skills another replica (a "
        "process on the same store) added or removed; each check is one small query.",
    )

    @field_validator("url")
    @classmethod
    def _empty_or_postgresql(cls, value: SecretStr | None) -> SecretStr | None:
        """Only PostgreSQL URLs; the error names the scheme, never the URL (its password)."""
        text = check_store_url(value.get_secret_value()) if value is not None else ""
        return SecretStr(text) if text else None

    @property
    def backend(self) -> Literal["sqlite", "postgresql"]:
        """Which store `url` selects."""
        return store_backend(self.url_in_clear())

    def url_in_clear(self) -> str:
        """`url` with its password ("" for SQLite): for opening the store only, never to show."""
        return self.url.get_secret_value() if self.url is not None else ""


class VisionSettings(Endpoint):
    """How images reach a model: natively (multimodal) or described by a vision model."""

    base_url: str = Field("", description="Vision model endpoint; empty = the main model's.")
    api_key: SecretStr | None = _secret("Vision model API key; empty = the main model's.")
    model: str = Field("", description="Model that describes images; empty = none.")
    multimodal: bool = Field(False, description="The main model accepts images directly.")
    prompt: str = Field(
        "Describe the image as Markdown, with no other talk.",
        description="Instruction sent with each image to the vision model.",
    )


class WebSettings(Section):
    """Jina search and reader (webSearch / webExplore)."""

    token: SecretStr | None = _secret("Jina API token (Bearer).")
    search_url: str = Field("https://s.jina.ai/", description="Jina search endpoint.")
    reader_url: str = Field(
        "https://r.jina.ai/", description="Jina reader endpoint (URL is appended)."
    )
    timeout: float = Field(30.0, gt=0, description="Seconds per web request.")
    max_chars: int = Field(
        8000, ge=100, description="Results are truncated to this many characters."
    )

    @field_validator("search_url", "reader_url")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        # The reader URL is a prefix the page URL is appended to: "" would make every fetch go
        # straight to the page, with the Jina token in its Authorization header.
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "must be the http:// or https:// address of the Jina (or compatible) service; "
                "empty is refused, it would send the web token to every page fetched"
            )
        return value.strip()


class MemeSettings(Section):
    """The meme tool: any API that returns a list of image URLs."""

    url: str = Field(
        "https://api.giphy.com/v1/stickers/search?api_key=${key}&q=${msg}&limit=${num}",
        description="Request URL template with ${msg}, ${num} and ${key} placeholders.",
    )
    key: SecretStr | None = _secret("API key substituted for ${key} (GIPHY by default).")
    list_path: str = Field(
        "data", description="JMESPath to the list of results (e.g. data, results[*].media)."
    )
    img_field: str = Field(
        "images.fixed_width.url", description="JMESPath to the image URL within each result."
    )
    num: int = Field(50, ge=1, le=500, description="How many results to ask for.")
    timeout: float = Field(30.0, gt=0, description="Seconds per request (search and download).")


class BashSettings(Section):
    """The bash tool: blacklist → refuse, whitelist → run, otherwise ask for approval."""

    enable: bool = Field(False, description="Register the bash tool.")
    shell: str = Field("", description="Shell to run commands with; empty = sh.")
    env: list[str] = Field(
        default_factory=list,
        description="Extra KEY=VALUE environment entries (values masked when shown).",
        json_schema_extra={"sensitive": "values"},
    )
    whitelist: list[str] = Field(
        default_factory=list,
        description="Regexes, matched from the start of the command, of commands that run "
        "without asking; only a single simple command qualifies (no ; && || | & newlines, $, "
        "backticks, redirections, parentheses or comments). A rule allowing a program that runs "
        "its arguments (sh, env, xargs, find -exec, git -c ...) allows anything.",
    )
    blacklist: list[str] = Field(
        default_factory=lambda: [
            r"ania\.(db|toml)",
            r"\bmkfs",  # anywhere: also after sudo, $(...), xargs
            r"\b(shutdown|reboot|halt|poweroff)\b",
        ],
        description="Regexes (searched anywhere) of commands that are always refused: a "
        "convenience against mistakes, not a security boundary (a shell can spell anything "
        "another way); use approval and bash.sandbox for that.",
    )
    require_approval: bool = Field(
        True,
        description="Ask a person before every command the whitelist does not cover, even "
        "when approval.enable is off. Turn off only for unattended, trusted use.",
    )
    workdir: str = Field(
        "", description="Folder commands run in (writable in the sandbox); empty = current."
    )
    sandbox: Literal["none", "bwrap"] = Field(
        "none",
        description="'bwrap': run commands in a bubblewrap sandbox (read-only system, writable "
        "workdir, private /tmp, no network, resource limits; the data directory, skills "
        "folder, hooks/MCP/commands files, config files, security.secret_files, credentials "
        "and daemon sockets hidden and not creatable); 'none': run them directly as this user.",
    )
    sandbox_network: bool = Field(False, description="Let sandboxed commands use the network.")
    sandbox_cpu_seconds: int = Field(
        60, ge=0, description="CPU seconds a sandboxed command may use (0 = no limit)."
    )
    sandbox_memory_mb: int = Field(
        4096,
        ge=0,
        description="Address space (virtual memory) of each sandboxed process in MiB; runtimes "
        "that reserve much more than they use (Java, Node) may need more (0 = no limit).",
    )
    sandbox_max_processes: int = Field(
        256,
        ge=0,
        description="Processes a sandboxed command may run (RLIMIT_NPROC: not enforced for "
        "root; 0 = no limit).",
    )
    timeout: float = Field(
        120.0, gt=0, le=3600, description="Seconds before the command is killed."
    )
    max_output_chars: int = Field(
        4096, ge=256, description="Output is truncated to this many characters."
    )


class FileSettings(Section):
    """Sending local files (file) and loading local images (local_image)."""

    enable: bool = Field(False, description="Register the file tool.")
    local_image: bool = Field(False, description="Register the local_image tool.")
    max_bytes: int = Field(
        20 * 1024 * 1024, ge=1, description="Largest file either tool will read."
    )
    roots: list[Path] = Field(
        default_factory=list,
        description="Folders (with their subfolders) either tool may read from; empty = the "
        "working directory. /proc, /sys, /dev, the data directory and secret files never.",
    )


class SecuritySettings(Section):
    """What child processes see of this one's environment, and files kept from tools."""

    pass_env: list[str] = Field(
        default_factory=list,
        description="Environment variables (names or glob patterns, case-insensitive) child "
        "processes (bash, shell hooks, stdio MCP servers, process=True tools) inherit besides "
        "PATH, HOME, USER, LOGNAME, SHELL, TERM, TZ, TMPDIR, LANG and LC_*; '*' passes all. A "
        "pattern never passes a secret_env variable, an exact name does; ANIA_* never passes. "
        "Entries set on purpose (bash.env, an MCP server's env) always reach their child.",
    )
    secret_env: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SECRET_ENV),
        description="Environment variables (names or glob patterns, case-insensitive) a "
        "pass_env pattern never passes to a child process; ANIA_* never passes.",
    )
    secret_files: list[Path] = Field(
        default_factory=list,
        description="More files or folders holding secrets: hidden (and not creatable) in the "
        "bash sandbox and never read by the file tools, like the config file and the data "
        "directory.",
    )


class ApprovalSettings(Section):
    """Human approval of tool calls."""

    enable: bool = Field(False, description="Ask a human before the tools listed in `tools`.")
    tools: list[str] = Field(
        default_factory=lambda: ["file"], description="Tools that need approval when enabled."
    )
    timeout: float = Field(
        120.0, ge=10, le=240, description="Seconds to wait for a verdict before denying."
    )


class MCPSettings(Section):
    """MCP servers."""

    config_file: Path = Field(
        Path("mcp.json"),
        description="MCP servers file ({'mcpServers': {...}}, VS Code's {'servers': {...}} or "
        "{'servers': [...]}).",
    )
    lazy_load: bool = Field(
        True, description="Expose mcp_discover_/mcp_load_ tools instead of every MCP tool."
    )
    self_manage: bool = Field(
        False, description="Give the AI mcp_list/mcp_add/mcp_remove/mcp_reconnect."
    )
    connect_timeout: float = Field(30.0, gt=0, description="Seconds to connect and list tools.")
    max_result_chars: int = Field(8000, ge=100, description="MCP results are truncated to this.")
    auto_reconnect: bool = Field(
        True,
        description="Reconnect a disconnected server when a tool of it is next used (backoff "
        "1 s doubling to 60 s between attempts).",
    )
    ping_interval: float = Field(
        30.0,
        ge=0,
        description="Seconds between pings of an HTTP/SSE server, to notice a dead one before "
        "the next call (stdio servers are watched through their process); 0 = no pings.",
    )
    sampling_model: str = Field(
        "",
        description="Model that answers MCP sampling requests (servers with "
        "mcpServers.<name>.sampling = true); empty = the main model, or the configured model a "
        "server's model hint names.",
    )
    sampling_max_tokens: int = Field(
        1024, ge=1, description="Cap on an MCP sampling request's maxTokens."
    )
    sampling_requester_approves: bool = Field(
        False,
        description="In chats, the person who started the run may approve a server's sampling "
        "request (default: admins only; in a notebook the local user always may).",
    )


class SkillSettings(Section):
    """SKILL.md skills."""

    dir: Path = Field(Path("skills"), description="Folder of skills (<name>/SKILL.md).")
    whitelist: list[str] = Field(
        default_factory=list, description="Only these skills load; empty = all."
    )
    self_manage: bool = Field(
        False, description="Give the AI skill_list/skill_install/skill_remove."
    )
    allow_private_hosts: list[str] = Field(
        default_factory=list,
        description="Non-public addresses or CIDR networks skill_install may download from "
        "(e.g. an intranet skill server); empty = public addresses only.",
    )

    @field_validator("allow_private_hosts")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        import ipaddress

        for item in value:
            try:
                ipaddress.ip_network(item.strip(), strict=False)
            except ValueError:
                raise ValueError(
                    f"{item!r} is not an IP address or CIDR network (e.g. 10.0.0.5, 10.1.0.0/16)"
                ) from None
        return [item.strip() for item in value]


class AdminSettings(Section):
    """Who administers the agent (approves config changes, manages slash commands)."""

    ids: list[str] = Field(
        default_factory=list,
        description="User ids (as front ends pass them as `sender`) with admin rights.",
    )


# Self-management, config and skill-management tools: runs of admins only (roles.admin_tools).
DEFAULT_ADMIN_TOOLS = (
    "config_*",
    "mcp_add",
    "mcp_list",
    "mcp_reconnect",
    "mcp_remove",
    "skill_install",
    "skill_list",
    "skill_reload",
    "skill_remove",
)


class RolesSettings(Section):
    """Roles per chat (member < trusted < admin) and the tools each role may make the model run."""

    trusted: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Trusted users per chat: a session key (g:<group>, f:<user>, or * for every "
        "chat) → sender ids in the form of admin.ids (e.g. qq:10001). Admins are admin.ids; "
        "everyone else is a member.",
    )
    admin_tools: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ADMIN_TOOLS),
        description="Tools (names or fnmatch globs such as config_*) only an admin's runs are "
        "offered and may call.",
    )
    trusted_tools: list[str] = Field(
        default_factory=list,
        description="Tools (names or globs) trusted users' and admins' runs may call, members' "
        "may not. Tools in neither list are open to everyone.",
    )

    @field_validator("admin_tools", "trusted_tools")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        patterns = [item.strip() for item in value]
        if any(not item for item in patterns):
            raise ValueError("a tool pattern is empty; give a tool name or a glob such as kb_*")
        return patterns

    @field_validator("trusted")
    @classmethod
    def _chats(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for chat, users in value.items():
            if not chat.strip():
                raise ValueError("a chat key is empty; use a session key such as g:123456 or *")
            ids = [user.strip() for user in users]
            if any(not user for user in ids):
                raise ValueError(f"an empty user id in the trusted users of {chat.strip()!r}")
            out[chat.strip()] = ids
        return out


class HooksSettings(Section):
    """Shell hooks run at engine events (SessionStart, PreToolUse, Stop, …)."""

    enable: bool = Field(False, description="Run the shell hooks of the hooks file.")
    file: Path = Field(
        Path("hooks.json"),
        description="Hooks file ({'hooks': {Event: [...]}}; original or Claude Code form).",
    )
    timeout: float = Field(
        10.0, gt=0, le=60, description="Seconds a hook may run unless its entry says otherwise."
    )


class TodoSettings(Section):
    """The todo_write task list of main sessions."""

    enable: bool = Field(True, description="Give main sessions the todo_write tool.")


class CommandsSettings(Section):
    """Custom slash commands (/name args → prompt template)."""

    enable: bool = Field(True, description="Expand custom slash commands from the file.")
    file: Path = Field(
        Path("commands.json"), description="Commands file ({'commands': {name: template}})."
    )


class ConfigToolSettings(Section):
    """The AI's config-center tools (config_get/set, config_file_get/set)."""

    enable: bool = Field(
        False, description="Register the config tools; changes always need an admin's approval."
    )


class NotebookSettings(Section):
    """The notebook face (%load_ext ania_nb)."""

    session: str = Field("", description="Default %%agent session; empty = one per notebook.")
    python_tool: bool = Field(True, description="Give the model the python tool (runs code here).")
    python_approval: bool = Field(
        True, description="Ask before each python tool call (Allow/Deny in the run widget)."
    )


class UISettings(Section):
    """What people read: the language of the front ends' messages (`ania_nb.catalogue`)."""

    language: Literal["", "en", "zh"] = Field(
        "",
        description="Language of notices, command replies, approval cards, status texts and "
        "errors people read: en or zh; empty = each front end's own (ania-nb serve: zh, the "
        "notebook and Python: en). What the model reads never changes.",
    )


MAX_RUN_SECONDS = 1800  # the longest any clock, subagent or team run may take


class ClockSettings(Section):
    """The clock: scheduled tasks that start one-shot agent runs."""

    enable: bool = Field(True, description="Run the scheduler and give the clock_* tools.")
    default_timeout: float = Field(
        120.0,
        gt=0,
        le=MAX_RUN_SECONDS,
        description="Seconds a task run may take unless the task says otherwise (≤1800).",
    )
    max_log_entries: int = Field(500, ge=1, description="Task-log entries kept (oldest evicted).")
    max_tasks_per_chat: int = Field(
        10,
        ge=0,
        description="Tasks a chat may have when a non-admin adds one (/clock add, clock_create; "
        "run-once tasks count too); admins are exempt; 0 = no limit.",
    )
    min_interval: float = Field(
        60.0,
        ge=0,
        description="Shortest time in seconds between two runs of a repeating task a non-admin "
        "creates or reschedules (an @every period, a cron schedule's closest fire times); "
        "run-once tasks and admins are exempt; 0 = no limit.",
    )
    misfire: Literal["run_once_late", "skip"] = Field(
        "run_once_late",
        description="What happens to a task's planned fire times that passed while no process "
        "held the clock (all stopped, or a leader replaced): run_once_late = one late run "
        "standing for all of them; skip = one 'skipped (no leader)' task-log entry instead. "
        "Looked back to the task's stored next fire time.",
    )
    max_tasks_per_run: int = Field(
        0,
        ge=0,
        description="Tasks one clock run may create with clock_create (its subagents may "
        "create none); 0 = none, so a task's runs never multiply tasks. Admins are not exempt: "
        "nobody stands behind a clock run.",
    )


class SubagentSettings(Endpoint):
    """Subagents: one-shot workers of the main agent; clock runs and teams use their model."""

    base_url: str = Field("", description="Endpoint of one-shot runs; empty = the main model's.")
    api_key: SecretStr | None = _secret("API key of one-shot runs; empty = the main model's.")
    model: str = Field(
        "", description="Model of subagents, team members and clock runs; empty = the main one."
    )
    enable: bool = Field(True, description="Give main sessions subagent_run/list/cancel.")
    timeout: float = Field(
        300.0, gt=0, le=MAX_RUN_SECONDS, description="Seconds a subagent may take (≤1800)."
    )
    max_iterations: int = Field(10, ge=1, le=200, description="LLM rounds of one subagent.")
    max_result_chars: int = Field(
        4000, ge=100, description="Characters of a subagent's reply handed back (rest cut)."
    )

    @property
    def own_endpoint(self) -> bool:
        """Whether one-shot runs have a model, endpoint or key of their own (else the main's)."""
        return bool(self.model.strip() or self.base_url.strip() or _secret_text(self.api_key))


class TeamSettings(Section):
    """Agent teams: role-described members run in parallel as subagents (team_run)."""

    enable: bool = Field(False, description="Give main sessions team_run/create/list/delete.")
    timeout: float = Field(
        300.0, gt=0, le=MAX_RUN_SECONDS, description="Seconds a team member may take (≤1800)."
    )
    max_iterations: int = Field(10, ge=1, le=200, description="LLM rounds of one member.")
    max_result_chars: int = Field(
        4000, ge=100, description="Characters of a member's reply in the report (rest cut)."
    )
    max_members: int = Field(5, ge=1, le=10, description="Members one team_run may have (≤10).")
