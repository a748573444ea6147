"""The message catalogue: what people read from the front ends, in English and in Chinese.

One message is in one language [issue 33]: the runner's notices, status texts, approval cards
and answers, the refusals shown to chat users and the built-in command replies all come from
`CATALOGUE`, each key with an ``en`` and a ``zh`` text (``str.format`` placeholders; the Chinese
text may leave out a placeholder the English one shows, never add one). What the *model* reads
(prompts, tool results, markers such as ``【定时任务】``) is not here: it stays as it is,
deterministic, whatever the front end's language.

**Which language** (`language_for`): ``ui.language`` when set (``en`` or ``zh``); unset, each
front end its own: chat sessions (``g:…``, ``f:…``: the runner, serving QQ) speak Chinese,
every other session (a notebook's ``nb:…``, an API caller's) English.

Names and user content stay as they are in either language: a tool's name, a config key such as
``admin.ids``, a command word (``/clock``), a user id, what a user wrote. Standard library only:
every layer may import this module.
"""

from __future__ import annotations

import string
from typing import Literal, get_args

from . import session_keys

__all__ = ["CATALOGUE", "LANGUAGES", "Language", "language_for", "placeholders", "say"]

Language = Literal["en", "zh"]
LANGUAGES: tuple[Language, ...] = get_args(Language)

CATALOGUE: dict[str, dict[Language, str]] = {
    # ------------------------------------------------------------ status texts of a reply
    "status.stopped": {"en": "The reply was stopped.", "zh": "AI 响应已被停止"},
    "status.timeout": {"en": "The request timed out.", "zh": "请求超时"},
    "status.error": {
        "en": "Something went wrong with this reply; the log has the details.",
        "zh": "无法解析的错误信息，请查看日志",
    },
    "status.shutdown": {
        "en": "The service is shutting down, so this reply was stopped; please send your "
        "message again in a moment.",
        "zh": "服务正在关闭，这次的回复已停止，请稍后再发一次~",
    },
    "status.suspended": {
        "en": "The service is restarting: the tool call waiting for approval is saved; the "
        "approval request is posted again after the restart and the reply goes on once it is "
        "allowed.",
        "zh": "服务正在重启：待审批的工具调用已保存，重启后会重新发送审批请求，批准后继续回复",
    },
    "status.unrun_call": {
        "en": "The model wrote a tool call as text and it was not run "
        '(llm.text_tool_calls = false); ask an admin to set it to "auto" and try again.',
        "zh": "模型把工具调用写成了文字，没有执行（llm.text_tool_calls = false）；"
        '请管理员设为 "auto" 后再试',
    },
    "status.quota": {
        "en": "Today's token quota is used up; please try again after it resets.",
        "zh": "今天的 token 额度已经用完了，额度重置后再来吧~",
    },
    # ------------------------------------------------------------ notices
    "notice.queued": {
        "en": "Still answering your previous message; yours is queued and answered next.",
        "zh": "正在回复上一条消息，你的消息已排队，稍后回复你~",
    },
    "notice.overflow": {
        "en": "Too many messages are waiting; please try again in a moment.",
        "zh": "排队消息太多啦，稍后再试试吧~",
    },
    "notice.held": {
        "en": "The service is restarting: your message is saved and answered after the restart.",
        "zh": "服务正在重启，你的消息已保存，重启后回复你~",
    },
    "notice.restart": {
        "en": "The reply to {what} was cut off by a restart; please send it again.",
        "zh": "刚才对{what}的回复被重启打断了，请再发一次~",
    },
    "notice.restart_quote": {"en": "“{text}”", "zh": "「{text}」"},
    "notice.restart_join": {"en": ", ", "zh": "、"},
    "notice.restart_yours": {"en": "your message", "zh": "你的消息"},
    "notice.background_stopped": {
        "en": "Background task {id} was stopped by a restart; ask me again if you still need it.",
        "zh": "后台任务 {id} 被重启打断，已停止；需要的话请让我重新做一次~",
    },
    "notice.background_result": {
        "en": "the result of background task {id}",
        "zh": "后台任务 {id} 的结果",
    },
    "notice.quota_fallback": {
        "en": "(Today's token quota is used up: a cheaper model, {model}, answers until it "
        "resets at {resets}.)",
        "zh": "（今天的 token 额度已用完：在 {resets} 恢复之前，由较便宜的模型 {model} 回答。）",
    },
    "storage.no_space": {
        "en": "The server's disk is full: I cannot answer for now; please ask the administrator "
        "to free some space.",
        "zh": "服务器存储空间已满，暂时无法回复，请联系管理员清理磁盘",
    },
    "storage.read_only": {
        "en": "The server's storage is read-only: I cannot answer for now; please tell the "
        "administrator.",
        "zh": "服务器存储为只读，暂时无法回复，请联系管理员",
    },
    "storage.no_permission": {
        "en": "The server may not write its storage (no permission): I cannot answer for now; "
        "please tell the administrator.",
        "zh": "服务器存储无法写入（没有权限），暂时无法回复，请联系管理员",
    },
    "notice.timed_out": {
        "en": "⏰ clock task “{title}” timed out ({period}), aborted",
        "zh": "⏰ 定时任务「{title}」超时（{period}），已中止",
    },
    # ------------------------------------------------------------ approval cards
    "approval.card": {
        "en": "[Tool approval]{resent} The AI asks to run the tool {tool}:\n{body}\n"
        "{who} may answer {within}: reply “allow” or “deny” (request {id}).",
        "zh": "【工具审批】{resent}AI 请求执行工具：{tool}\n{body}\n"
        "请{who}{within}回复「允许」或「拒绝」（请求 {id}）",
    },
    "approval.resent": {"en": " (sent again after a restart)", "zh": "（重启后重新发送）"},
    "approval.who_admin": {"en": "An admin", "zh": "管理员"},
    "approval.who_requester": {
        "en": "The requester ({names}) or an admin",
        "zh": "发起人（{names}）或管理员",
    },
    "approval.names_join": {"en": ", ", "zh": "、"},
    "approval.within": {"en": "within {seconds} s", "zh": "在 {seconds} 秒内"},
    "approval.within_resent": {"en": "within the original time limit", "zh": "在原定时限内"},
    "approval.more": {
        "en": "\n… {count} more characters: reply “show {id}” to see them all",
        "zh": "\n… 还有 {count} 个字符：回复「查看 {id}」看全文",
    },
    "approval.args_raw": {
        "en": "{tool} — arguments (not a JSON object, shown as sent):",
        "zh": "{tool} — 参数（不是 JSON 对象，按原样显示）：",
    },
    "approval.args_none": {"en": "{tool} — no arguments", "zh": "{tool} — 没有参数"},
    "approval.args_count": {
        "en": "{tool} — {count} argument(s):",
        "zh": "{tool} — {count} 个参数：",
    },
    "approval.arg": {
        "en": "▸ {name} ({count} characters):",
        "zh": "▸ {name}（{count} 个字符）：",
    },
    "approval.shell_unparsed": {
        "en": "  (the shell line could not be parsed: read it character by character)",
        "zh": "  （无法解析这行命令：请逐字阅读）",
    },
    "approval.shell_commands": {
        "en": "  it runs {count} commands:",
        "zh": "  它会执行 {count} 条命令：",
    },
    # ------------------------------------------------------------ answers to a verdict
    "approval.allowed": {
        "en": "Allowed: {tool} (request {id})",
        "zh": "已允许：{tool}（请求 {id}）",
    },
    "approval.denied": {"en": "Denied: {tool} (request {id})", "zh": "已拒绝：{tool}（请求 {id}）"},
    "approval.kept": {
        "en": "; it goes on after the restart",
        "zh": "，重启后继续",
    },
    "approval.none_to_show": {
        "en": "No approval request is waiting.",
        "zh": "没有待审批的请求",
    },
    "approval.refused": {"en": "Cannot answer: {reason}", "zh": "无法审批：{reason}"},
    # the reasons (`ania_nb.governance.approval.ApprovalRefused`); English ones are its message
    "approval.not_admin": {
        "en": "{tool} needs an admin's approval and '{approver}' is not an admin (admin.ids)",
        "zh": "{tool} 需要管理员审批，{approver} 不是管理员（admin.ids）",
    },
    "approval.not_requester": {
        "en": "'{approver}' may not answer this request: only the requester or an admin "
        "may answer it (asked by: {askers})",
        "zh": "{approver} 不能审批这个请求：只有发起人或管理员可以审批（发起人：{askers}）",
    },
    "approval.already_allowed": {
        "en": "approval request {id} was already allowed ({reason}); this answer was ignored",
        "zh": "审批请求 {id} 已经被允许，这次的回复没有生效",
    },
    "approval.already_denied": {
        "en": "approval request {id} was already denied ({reason}); this answer was ignored",
        "zh": "审批请求 {id} 已经被拒绝或超时，这次的回复没有生效",
    },
    "approval.no_pending_id": {
        "en": "no pending approval request with id '{id}'",
        "zh": "没有编号为 {id} 的待审批请求",
    },
    "approval.no_suspended_id": {
        "en": "no suspended approval request with id '{id}'",
        "zh": "没有编号为 {id} 的暂停中的审批请求",
    },
    "approval.none_pending": {
        "en": "no approval request is pending{where}",
        "zh": "当前没有待审批的请求",
    },
    "approval.none_suspended": {
        "en": "no approval request is suspended{where}",
        "zh": "当前没有暂停中的审批请求",
    },
    "approval.several_pending": {
        "en": "several approval requests are pending; answer one by its id",
        "zh": "有多个待审批的请求，请在回复里带上请求编号",
    },
    "approval.several_suspended": {
        "en": "several approval requests are suspended; answer one by its id",
        "zh": "有多个暂停中的审批请求，请在回复里带上请求编号",
    },
    "approval.gone": {
        "en": "approval request {id} is no longer waiting for an answer",
        "zh": "审批请求 {id} 已不再等待回复",
    },
    # ------------------------------------------------------------ built-in commands
    "command.stopped": {"en": "Stopped the reply.", "zh": "已停止回复。"},
    "command.nothing_running": {"en": "Nothing is running.", "zh": "当前没有正在进行的回复。"},
    "command.not_available": {
        "en": "/{name} is not available in this agent.",
        "zh": "/{name} 在这里不可用。",
    },
    "command.unknown": {"en": "Unknown command /{name}.", "zh": "没有 /{name} 这个命令。"},
    "command.no_prompts": {
        "en": "/{name}: no MCP servers are configured, so there are no prompts.",
        "zh": "/{name}：没有配置 MCP 服务器，所以没有可用的提示词。",
    },
    "command.plan_rank": {
        "en": "/plan {action} is for admins and trusted users in a group.",
        "zh": "群聊里只有管理员和受信任的用户可以使用 /plan {action}。",
    },
    "plan.on": {
        "en": "Plan mode on: the AI will only analyse and plan; /plan off to execute.",
        "zh": "已开启计划模式：AI 只分析和计划，不执行；/plan off 后再执行。",
    },
    "plan.already_on": {"en": "Already in plan mode.", "zh": "已经在计划模式中。"},
    "plan.off": {
        "en": "Plan mode off: the AI may act again.",
        "zh": "已关闭计划模式：AI 可以执行操作了。",
    },
    "plan.already_off": {"en": "Not in plan mode.", "zh": "当前不在计划模式中。"},
    "plan.is_on": {"en": "Plan mode is on.", "zh": "计划模式：开启。"},
    "plan.is_off": {"en": "Plan mode is off.", "zh": "计划模式：关闭。"},
    "plan.usage": {"en": "usage: /plan on | off | status", "zh": "用法：/plan on | off | status"},
    "command.help_title": {"en": "Commands:", "zh": "命令："},
    "command.help_prompts": {
        "en": "MCP prompts (arguments by position or name=value):",
        "zh": "MCP 提示词（参数按位置或 name=value 给出）：",
    },
    "command.cmd_off": {
        "en": "Custom commands are turned off (commands.enable).",
        "zh": "自定义命令已关闭（commands.enable）。",
    },
    "command.cmd_none": {"en": "No custom commands.", "zh": "还没有自定义命令。"},
    "command.cmd_list": {"en": "Custom commands:", "zh": "自定义命令："},
    "command.cmd_usage": {
        "en": "usage: /cmd list | /cmd add <name> <template…> | /cmd del <name>",
        "zh": "用法：/cmd list | /cmd add <name> <template…> | /cmd del <name>",
    },
    "command.cmd_admin": {
        "en": "/cmd {action} is for admins only.",
        "zh": "只有管理员可以使用 /cmd {action}。",
    },
    "command.cmd_saved": {"en": "Saved /{name}.", "zh": "已保存 /{name}。"},
    "command.cmd_deleted": {"en": "Deleted /{name}.", "zh": "已删除 /{name}。"},
    "command.cmd_missing": {
        "en": "There is no custom command /{name}.",
        "zh": "没有 /{name} 这个自定义命令。",
    },
    "command.cmd_not_saved": {"en": "Not saved: {reason}", "zh": "没有保存：{reason}"},
    "help.stop": {
        "en": "stop the current reply and drop waiting messages",
        "zh": "停止当前回复，并丢弃排队中的消息",
    },
    "help.plan": {
        "en": "/plan on|off|status: plan only, no side effects (on/off in groups: admins, trusted)",
        "zh": "/plan on|off|status：只做计划，不执行有副作用的操作（群聊中 on/off 仅限管理员和"
        "受信任的用户）",
    },
    "help.cmd": {
        "en": "/cmd list|add|del: custom commands (add/del: admins only)",
        "zh": "/cmd list|add|del：自定义命令（add/del 仅限管理员）",
    },
    "help.help": {"en": "this list", "zh": "显示这份列表"},
    "help.clock": {
        "en": "/clock list|add|del|on|off|info|timeout|run|log|help: scheduled tasks",
        "zh": "/clock list|add|del|on|off|info|timeout|run|log|help：定时任务",
    },
    "help.quota": {
        "en": "/quota [reset [SESSION|all]]: today's token usage and limits; admins may reset",
        "zh": "/quota [reset [SESSION|all]]：今天的 token 用量和限额；管理员可以重置",
    },
}


def say(key: str, language: Language, /, **params: object) -> str:
    """The catalogue's ``key`` in ``language``, its placeholders filled from ``params``.

    Raises KeyError for an unknown key or language (a programming error, caught by the tests).
    """
    return CATALOGUE[key][language].format(**params)


def language_for(setting: str, session: str) -> Language:
    """The language of what ``session``'s front end shows: ``ui.language``, else its default.

    ``setting`` is ``ui.language`` (``""``: unset). Unset, chat sessions (the runner) get
    ``zh``, every other session ``en`` (see the module docstring).
    """
    if setting in LANGUAGES:
        return setting  # type: ignore[return-value]
    return "zh" if session_keys.parse(session).is_chat else "en"


def placeholders(text: str) -> set[str]:
    """The names of the ``{placeholders}`` in a catalogue text."""
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}
