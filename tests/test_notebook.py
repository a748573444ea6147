"""The notebook face without a kernel: interpolation, the cell rewriter, the notebook tools."""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from _waits import until

from ania_nb.notebook.interpolate import interpolate
from ania_nb.notebook.magics import transform_cell
from ania_nb.notebook.tools import NotebookVarsTool, PythonTool, run_code
from ania_nb.testing import reply, tool_call


def test_interpolation_fills_names_cells_and_outputs():
    ns = {"x": 41, "df_name": "sales", "In": ["", "x = 41", "x + 1"], "Out": {2: 42}}
    assert interpolate("What is {x} + 1?", ns) == "What is 41 + 1?"
    assert interpolate("Explain {In[1]} which gave {Out[2]}", ns) == "Explain x = 41 which gave 42"
    assert interpolate("{x:>5}|", ns) == "   41|"


def test_interpolation_leaves_unknowns_escapes_and_json_alone():
    ns = {"x": 1}
    assert interpolate("{missing} and {x}", ns) == "{missing} and 1"
    assert interpolate("{{x}} is literal", ns) == "{x} is literal"
    assert interpolate('parse {"a": 1}', ns) == 'parse {"a": 1}'
    assert interpolate("{Out[9]}", {"Out": {}}) == "{Out[9]}"
    assert interpolate("{x.nope}", ns) == "{x.nope}"


def test_transform_rewrites_agent_cells_into_an_awaited_call():
    lines = ["%%agent --session s1\n", "Summarise {df_name}\n", "please\n"]
    [code] = transform_cell(lines)
    assert code.startswith("await __import__('ania_nb.notebook.magics'")
    assert "run_magic('agent', '--session s1', 'Summarise {df_name}\\nplease\\n')" in code
    [line_form] = transform_cell(["%agent what time is it?\n"])
    assert "run_magic('agent', 'what time is it?')" in line_form
    [manage] = transform_cell(["%ania plan on"])
    assert "run_magic('ania', 'plan on')" in manage


def test_transform_leaves_help_other_magics_and_mixed_cells_alone():
    for lines in (
        ["%%agent?\n"],
        ["%agent?\n"],
        ["%%agents\n", "x\n"],
        ["%agent hello\n", "x = 1\n"],
        ["%ania?\n"],
        ["print('%%agent')\n"],
        [],
    ):
        assert transform_cell(lines) == lines


def test_run_code_captures_output_value_and_errors():
    ns: dict = {}
    assert run_code("x = 20\nprint('hi')\nx * 2", ns) == "hi\n40"
    assert ns["x"] == 20
    assert run_code("1/0", ns).startswith("stderr: Traceback") and "ZeroDivisionError" in run_code(
        "1/0", ns
    )
    assert run_code("def f(:\n  pass", ns).startswith("SyntaxError")
    assert run_code("pass", ns) == "(no output)"
    assert run_code("print('x' * 5000)", ns).endswith("...(output truncated)")


async def test_notebook_vars_lists_and_describes_variables(llm, make_agent):
    ns = {"rows": [1, 2, 3], "name": "Ada", "_hidden": 1, "sys": sys, "In": []}
    llm.script(
        reply(
            tool_calls=[tool_call("notebook_vars"), tool_call("notebook_vars", {"name": "rows"})]
        ),
        reply("ok"),
    )
    agent = make_agent(tools=[NotebookVarsTool(ns)])
    result = await agent.chat("what do I have?")
    listing, detail = (c.result for c in result.tool_calls)
    assert listing.splitlines() == ["name: str len=3 = 'Ada'", "rows: list len=3 = [1, 2, 3]"]
    assert detail == "rows: list len=3 = [1, 2, 3]"


async def test_python_tool_needs_approval_and_runs_in_the_namespace(llm, make_agent):
    from ania_nb import Callbacks

    ns: dict = {}
    llm.script(reply(tool_calls=[tool_call("python", {"code": "y = 6 * 7\ny"})]), reply("done"))
    agent = make_agent(tools=[PythonTool(ns)])

    def approve(request):
        agent.answer_approval(request.id, allow=True)

    result = await agent.chat("compute", callbacks=Callbacks(request_approval=approve))
    assert result.tool_calls[0].result == "42" and ns["y"] == 42

    llm.script(reply(tool_calls=[tool_call("python", {"code": "z = 1"})]), reply("fine"))
    denied = await agent.chat("again")  # no front end to ask: refused, nothing ran
    assert "not approved" in denied.tool_calls[0].result and "z" not in ns


def test_load_ext_is_light_and_registers_the_magics():
    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "ip.run_line_magic('load_ext', 'ania_nb')\n"
        "assert 'agent' in ip.magics_manager.magics['cell']\n"
        "assert {'agent', 'ania'} <= set(ip.magics_manager.magics['line'])\n"
        "heavy = [m for m in ('openai', 'mcp', 'lancedb', 'ipywidgets') if m in sys.modules]\n"
        "print(heavy)\n"
        "ip.run_line_magic('unload_ext', 'ania_nb')\n"
        "assert 'agent' not in ip.magics_manager.magics['cell']\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("line", ["--bogus", "--session"])
def test_bad_options_are_usage_errors(line):
    from IPython.core.error import UsageError
    from IPython.core.magic_arguments import parse_argstring

    from ania_nb.notebook.magics import AgentMagics

    with pytest.raises(UsageError):
        parse_argstring(AgentMagics.agent_cell, line)


# ---------------------------------------------------------------------------- errors in magics


def _ipython(code: str, cwd: Path, *, setup: str = "") -> str:
    """Run ``code`` in a fresh InteractiveShell in a subprocess; return its stdout + stderr."""
    script = (
        f"{setup}\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        f"{code}\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=cwd
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


@pytest.mark.parametrize(
    "cell",
    [
        "%%agent\nhello",  # rewritten into an awaited call
        "%agent hello",
        "%ania plan on",
        "x = 1\n%ania plan on",  # not rewritten: IPython calls the magic itself
    ],
)
def test_usage_errors_in_magics_print_one_line_without_a_traceback(tmp_path, cell):
    (tmp_path / "ania.toml").write_text('[agent]\nrun_timeout = "soon"\n')
    code = f"ip.run_line_magic('load_ext', 'ania_nb')\nip.run_cell({cell!r})\n"
    out = _ipython(code, tmp_path)
    assert "UsageError: invalid configuration" in out
    assert "agent.run_timeout" in out and "'soon'" in out
    assert "Traceback" not in out and "ConfigError" not in out and "File " not in out


@pytest.mark.parametrize("missing", ["ipywidgets", "ipykernel"])
def test_load_ext_without_the_notebook_extra_names_the_pip_install(tmp_path, missing):
    # sys.modules[name] = None makes `import name` fail as if the package were not installed.
    setup = f"import sys; sys.modules[{missing!r}] = None"
    code = (
        "ip.run_cell('%load_ext ania_nb')\n"
        "print('registered:', 'agent' in ip.magics_manager.magics['cell'])\n"
        "try:\n"
        "    import ania_nb; ania_nb.load_ipython_extension(ip)\n"
        "except ImportError as exc:\n"
        "    print('ImportError', type(exc).__name__, exc.name)\n"
    )
    out = _ipython(code, tmp_path, setup=setup)
    assert 'pip install "ania-nb[notebook]"' in out
    assert f"needs the {missing!r} package" in out
    assert "registered: False" in out
    assert f"ImportError MissingExtraError {missing}" in out


def test_ania_mcp_add_reports_bad_input_and_failed_servers_without_a_traceback(tmp_path):
    (tmp_path / "mcp.json").write_text('{"servers": []}')
    (tmp_path / "ania.toml").write_text(
        f'[store]\ndata_dir = "{tmp_path / "data"}"\n[skills]\ndir = "{tmp_path / "none"}"\n'
        f'[mcp]\nconfig_file = "{tmp_path / "mcp.json"}"\n'
        '[llm]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'  # never asked: no run
    )
    missing = tmp_path / "no-such-server.py"
    code = (
        "ip.run_line_magic('load_ext', 'ania_nb')\n"
        "ip.run_cell(\"%ania mcp add 'bad name!' uvx\")\n"
        f"ip.run_cell('%ania mcp add gone {sys.executable} {missing}')\n"
        "ip.run_cell('%unload_ext ania_nb')\n"
    )
    out = _ipython(code, tmp_path)
    assert "UsageError: %ania mcp add: server 'bad name!': field 'name'" in out
    assert "MCP server 'gone' (stdio" in out and "could not be connected" in out
    assert "Traceback" not in out and "ValidationError" not in out


# ------------------------------------------------------------------ the magics in a live shell
# IPython's own InteractiveShell: cells go through the rewriter and run on IPython's loop, as in a
# terminal. Each test fails when the option or sub-command it names is ignored.


@pytest.fixture
def shell(llm, tmp_path, monkeypatch):
    """A shell with ania_nb loaded and its Agent pointed at the scripted server."""
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)  # the default session: nb:default
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "ania_nb")
    state = ip.magics_manager.registry["AgentMagics"].state
    state.overrides.update(
        {
            "llm.base_url": llm.base_url,
            "llm.api_key": llm.api_key,
            "llm.model": "scripted",
            "llm.stream": False,
            "retry.base_delay": 0.01,
            "store.data_dir": str(tmp_path / "data"),
            "skills.dir": str(tmp_path / "no-skills"),
            "mcp.config_file": str(tmp_path / "no-mcp.json"),
        }
    )
    ip.user_ns.pop("_", None)
    ip.user_ns["background"] = lambda: list(state.background)
    yield ip
    llm.responder = None
    if "AgentMagics" in ip.magics_manager.registry:
        ip.run_line_magic("unload_ext", "ania_nb")


def run(ip, code: str):
    """Run one cell; return (its value, captured output); fail on an error in the cell."""
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        result = ip.run_cell(code)
    result.raise_error()
    return result.result, captured


def state_of(ip):
    return ip.magics_manager.registry["AgentMagics"].state


def widgets(captured) -> list:
    return [o for o in captured.outputs if "application/vnd.jupyter.widget-view+json" in o.data]


def held(llm) -> threading.Event:
    """Hold every model request until the returned event is set; then answer "late answer"."""
    release = threading.Event()

    def answer(request):
        release.wait(20)
        return reply("late answer")

    llm.responder = answer
    return release


def last_run(ip):
    """The RunResult a run stored as ``_`` (None if ``_`` holds anything else)."""
    from ania_nb import RunResult

    value = ip.user_ns.get("_")
    return value if isinstance(value, RunResult) else None


def roles(request) -> list[str]:
    return [m["role"] for m in request.messages]


def test_session_option_picks_the_conversation(shell, llm):
    llm.script(reply("noted A"), reply("noted B"), reply("A it was"))
    run(shell, "%%agent -q\nremember A")
    value, _ = run(shell, "%%agent -q --session other\nremember B")
    assert value.session == "other"
    assert roles(llm.requests[1]) == ["system", "user"]  # none of nb:default's history
    run(shell, "%agent -q what did I say?")
    third = llm.requests[2].messages
    assert roles(llm.requests[2]) == ["system", "user", "assistant", "user"]
    assert third[1]["content"].endswith("remember A") and third[2]["content"] == "noted A"


def test_a_notebook_session_saved_by_config_set_is_used_from_the_first_cell_on(
    shell, llm, tmp_path
):
    from ania_nb.config import SAVED_CONFIG_NAMESPACE
    from ania_nb.store import Store

    async def save() -> None:  # as config_set saved it in an earlier kernel: only in the store
        store = await Store.open(tmp_path / "data")
        await store.kv(SAVED_CONFIG_NAMESPACE).set("notebook.session", "nb:shared")
        await store.close()

    asyncio.run(save())
    llm.script(reply("first"), reply("second"))
    first, _ = run(shell, "%%agent -q\nhello")
    second, _ = run(shell, "%%agent -q\nagain")
    assert (first.session, second.session) == ("nb:shared", "nb:shared")
    _, captured = run(shell, "%ania plan status")
    assert captured.stdout.strip() == "plan mode is off for nb:shared"


def test_new_option_starts_a_fresh_conversation(shell, llm):
    llm.script(reply("hi"), reply("fresh"))
    run(shell, "%%agent -q\nhello")
    run(shell, "%%agent -q --new\nstart over")
    assert roles(llm.requests[1]) == ["system", "user"]
    _, captured = run(shell, "%ania history")  # only the new exchange is stored
    assert "hello" not in captured.stdout and "start over" in captured.stdout


def test_model_option_reaches_the_request_for_that_cell_only(shell, llm):
    llm.script(reply("one"), reply("two"))
    run(shell, "%%agent -q --model other-model\nhi")
    run(shell, "%%agent -q\nhi again")
    assert [r.model for r in llm.requests] == ["other-model", "scripted"]


def test_plan_option_is_on_during_the_cell_and_off_after_it(shell, llm):
    llm.script(reply("a plan"), reply("done"), reply("still planning"))
    run(shell, "%%agent -q --plan\nplan the work")
    assert "[Plan mode]" in llm.requests[0].messages[-1]["content"]
    agent = state_of(shell).agent()
    assert not agent.plan_mode("nb:default")
    run(shell, "%%agent -q\ndo the work")
    assert "[Plan mode]" not in llm.requests[1].messages[-1]["content"]
    run(shell, "%ania plan on")  # plan mode the user turned on stays on after a --plan cell
    run(shell, "%%agent -q --plan\nmore planning")
    assert agent.plan_mode("nb:default")


def test_quiet_option_shows_no_widget_and_returns_the_result(shell, llm):
    llm.script(reply("shown"), reply("quiet"))
    value, captured = run(shell, "%%agent\nwith a view")
    assert value is None and widgets(captured)
    assert shell.user_ns["_"].text == "shown"
    value, captured = run(shell, "%%agent -q\nwithout")
    assert value.text == "quiet" and widgets(captured) == []


def test_bg_option_returns_while_the_reply_is_still_held(shell, llm):
    release = held(llm)
    value, _ = run(shell, "%%agent --bg -q\nslow task")
    # The model has not answered (it cannot until release), yet the cell is done.
    assert value is None and last_run(shell) is None
    run(shell, "tasks = background()")
    assert len(shell.user_ns["tasks"]) == 1
    shell.user_ns["first_request"] = lambda: llm.wait_for_requests(1)
    run(shell, "import asyncio\nseen = await asyncio.to_thread(first_request)")
    assert last_run(shell) is None  # the run is under way, its reply still held
    release.set()
    run(shell, "import asyncio\ndone, pending = await asyncio.wait(tasks, timeout=20)")
    assert shell.user_ns["pending"] == set()
    assert last_run(shell).text == "late answer"


def test_ania_stop_ends_a_background_run(shell, llm):
    release = held(llm)
    shell.user_ns["first_request"] = lambda: llm.wait_for_requests(1)
    try:
        run(shell, "%%agent --bg -q\nslow task")
        # The run is under way: its request reached the model, whose reply is held.
        run(shell, "import asyncio\nseen = await asyncio.to_thread(first_request)")
        run(shell, "tasks = background()")
        _, captured = run(shell, "%ania stop")
        assert "stopped the running request" in captured.stdout
        run(shell, "done, pending = await asyncio.wait(tasks, timeout=20)")
        assert shell.user_ns["pending"] == set()
        assert last_run(shell) is None  # the run never finished
    finally:
        release.set()
    shell.user_ns["agent"] = state_of(shell).agent()
    run(shell, "runs = await agent.runs(session='nb:default')")
    assert [r.status for r in shell.user_ns["runs"]] == ["stopped"]
    # The loop runs only while a cell does: let the session's worker see its run end.
    run(shell, "await asyncio.wait_for(agent.sessions.get('nb:default').worker, 20)")
    _, captured = run(shell, "%ania stop")
    assert "nothing was running" in captured.stdout


def test_ania_history_clear_forgets_the_conversation(shell, llm):
    llm.script(reply("first reply"), reply("second reply"))
    run(shell, "%%agent -q\nfirst")
    _, captured = run(shell, "%ania history clear")
    assert "removed 2 messages from nb:default" in captured.stdout
    run(shell, "%%agent -q\nsecond")
    assert roles(llm.requests[1]) == ["system", "user"]


def test_ania_mcp_shows_where_servers_come_from_and_a_broken_file(shell, llm, tmp_path):
    broken = tmp_path / "mcp.json"
    broken.write_text('{"servers": {"demo": {"type": "stdio"}}}')  # VS Code form, no command
    state_of(shell).overrides.update({"mcp.config_file": str(broken), "mcp.self_manage": True})
    llm.script(reply("still here"))
    run(shell, "%agent -q hello")  # chat works with MCP off
    _, captured = run(shell, "%ania mcp")
    first = captured.stdout.splitlines()[0]
    assert first.startswith(f"MCP servers from {broken}: MCP config file")
    assert "server 'demo': field 'command'" in first and "off until the file is fixed" in first
    assert "no MCP servers" in captured.stdout


def test_unload_ext_removes_the_cell_rewriter_and_closes_the_agent(shell, llm):
    from ania_nb.notebook.magics import transform_cell

    llm.script(reply("hi"))
    run(shell, "%agent -q hello")  # the Agent now lives on IPython's loop
    assert "run_magic" in shell.transform_cell("%%agent\nhi\n")
    state = state_of(shell)
    shell.run_line_magic("unload_ext", "ania_nb")
    assert not state.agent_created
    assert transform_cell not in shell.input_transformers_cleanup
    assert "run_magic" not in shell.transform_cell("%%agent\nhi\n")
    assert "run_magic" not in shell.transform_cell("%agent hi\n")
    shell.run_line_magic("load_ext", "ania_nb")  # and loading again adds it once
    assert shell.input_transformers_cleanup.count(transform_cell) == 1


async def test_unload_ext_on_a_running_loop_keeps_the_close_alive_and_logs_its_failure(
    shell, caplog
):
    import weakref

    state = state_of(shell)
    agent = state.agent()
    really_close = agent.aclose
    waiting: dict[str, weakref.ref] = {}

    async def close_that_fails():
        gate = asyncio.get_running_loop().create_future()  # only the closing task holds it
        waiting["gate"] = weakref.ref(gate)
        await gate
        raise RuntimeError("the store would not close")

    agent.aclose = close_that_fails
    try:
        shell.run_line_magic("unload_ext", "ania_nb")  # a kernel runs magics on its loop
        await until(lambda: "gate" in waiting, "the close to start")
        gc.collect()  # an unreferenced task (and the future it waits on) would go here
        gate = waiting["gate"]()
        assert gate is not None, "the close task was garbage-collected before it finished"
        gate.set_result(None)
        await until(lambda: "failed" in caplog.text, "the failed close to be logged")
        [record] = [r for r in caplog.records if r.name == "ania_nb.notebook"]
        assert record.getMessage() == "closing the Agent after %unload_ext failed"
        assert "RuntimeError: the store would not close" in caplog.text  # with its traceback
    finally:
        await really_close()


def test_new_keeps_the_old_conversation_listed_and_clear_deletes_it(shell, llm):
    llm.script(*(reply(word) for word in ("one", "two", "three", "four", "five")))
    run(shell, "%%agent -q\nfirst topic")
    _, captured = run(shell, "%%agent -q --new\nsecond topic")
    archive = captured.stdout.split("kept as ")[1].split()[0]
    assert archive.startswith("nb:default~")
    _, captured = run(shell, "%ania history list")
    rows = {line.split()[-2]: line for line in captured.stdout.splitlines()[1:-1]}
    assert rows["nb:default"].split()[:3] == ["*", "nb:default", "2"]
    assert rows[archive].split() == [archive, "2"]
    _, captured = run(shell, f"%ania history show {archive}")
    assert "first topic" in captured.stdout and "second topic" not in captured.stdout
    run(shell, f"%%agent -q -s {archive}\nback to the first topic")  # an archive can be resumed
    assert roles(llm.requests[2]) == ["system", "user", "assistant", "user"]
    # --new on a named session archives that one; two --new in one second never overwrite.
    run(shell, f"%%agent -q -s {archive} --new\nfresh")
    run(shell, "%%agent -q --new\nthird topic")
    _, captured = run(shell, "%ania history list")
    assert captured.stdout.count(f"{archive}~") == 1
    assert captured.stdout.count("nb:default~") == 3  # the first topic, its archive, the second
    _, captured = run(shell, f"%ania history clear {archive}")
    assert f"removed 2 messages from {archive}" in captured.stdout
    _, captured = run(shell, "%ania history")
    assert "third topic" in captured.stdout and "first topic" not in captured.stdout


def test_ania_log_with_a_run_id_shows_that_run_in_full(shell, llm):
    from IPython.utils.capture import capture_output

    llm.script(reply(tool_calls=[tool_call("notebook_vars")]), reply("checked the variables"))
    value, _ = run(shell, "%%agent -q\nwhich variables are there?")
    _, captured = run(shell, f"%ania log {value.run_id}")
    html = captured.outputs[-1].data["text/html"]
    assert f"#{value.run_id}" in html and "notebook_vars" in html
    assert "checked the variables" in html
    for line in ("log 999999", "log x"):
        with capture_output() as shown:
            result = shell.run_cell(f"%ania {line}")
        assert not result.success and "Traceback" not in shown.stdout + shown.stderr


@pytest.mark.parametrize("line", ["history frob", "history list x", "history show a b"])
def test_ania_history_bad_usage_is_one_line(shell, line):
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        result = shell.run_cell(f"%ania {line}")
    assert not result.success
    assert "usage: %ania history [list | show [SESSION] | clear [SESSION]]" in captured.stderr
    assert "Traceback" not in captured.stdout + captured.stderr


@pytest.mark.parametrize("word", ["help", "--help", "-h"])
def test_ania_help_prints_what_the_question_mark_shows(shell, word):
    from ania_nb.notebook.magics import AgentMagics

    _, captured = run(shell, f"%ania {word}")
    assert "%ania help                       this text (also %ania?)" in captured.stdout
    assert captured.stdout.strip() == inspect.cleandoc(AgentMagics.ania.__doc__)


def test_ania_clock_answers_in_the_notebooks_syntax(shell):
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        shell.run_cell("%ania clock add garbage")
    said = captured.stdout + captured.stderr
    assert "usage: %ania clock add [--once] <cron> | <title> | <content>" in said
    assert "/clock" not in said
    _, helped = run(shell, "%ania clock help")
    assert "%ania clock list — this chat's tasks" in helped.stdout
    assert "/clock" not in helped.stdout


def test_ania_kb_add_of_a_glob_matching_nothing_says_so_once(shell, tmp_path):
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        result = shell.run_cell(f"%ania kb add {tmp_path}/nothing-here/*.md")
    assert not result.success
    said = captured.stdout + captured.stderr
    assert "Traceback" not in said
    assert len([x for x in said.splitlines() if "nothing-here" in x]) == 1  # once, not twice
    shown = [o.data.get("text/plain", "") for o in captured.outputs]
    assert not any("✗" in text for text in shown)  # the bar is gone, not showing it as well


def test_help_shows_the_magic_names_and_their_usage(tmp_path):
    code = (
        "ip.run_line_magic('load_ext', 'ania_nb')\n"
        "ip.run_cell('%%agent?')\n"
        "print('=====')\n"
        "ip.run_cell('%agent?')\n"
    )
    cell_help, line_help = _ipython(code, tmp_path).split("=====")
    assert "%%agent [-s SESSION] [--new] [-m MODEL] [--plan] [--bg] [-q]\n" in cell_help
    assert "agent_cell" not in cell_help and "prompt" not in cell_help.split("\n\n")[1]
    assert "the cell body is the prompt" in cell_help and "keeps the old" in cell_help
    assert re.search(r"%agent \[-s SESSION\].*\n\s+prompt \[prompt \.\.\.\]", line_help)
    assert "agent_line" not in line_help


# ------------------------------------------------------------ which notebook is this? (_identity)


def _save(path: Path, *cell_ids: str) -> Path:
    cells = [
        {"cell_type": "code", "id": c, "metadata": {}, "source": "", "outputs": []}
        for c in cell_ids
    ]
    path.write_text(
        json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    return path


def _facts(path: Path, kernel: str | None = None):
    from ania_nb.notebook._identity import Facts, file_facts

    inode, cells = file_facts(str(path))
    return Facts(kernel_id=kernel, path=str(path), inode=inode, cells=cells)


def _record(path: Path, kernel: str | None = None, cell: str | None = None) -> dict:
    from ania_nb.notebook._identity import update

    facts = _facts(path, kernel)
    facts.cell_id = cell
    return update({}, facts)


def test_a_renamed_notebook_keeps_its_conversation_a_copy_does_not(tmp_path):
    from ania_nb.notebook._identity import choose

    untitled = _save(tmp_path / "Untitled.ipynb", "c1", "c2")
    records = {"nb:a": _record(untitled, kernel="k1", cell="c3")}  # c3 ran, not saved yet
    analysis = tmp_path / "analysis.ipynb"
    untitled.rename(analysis)
    assert choose(records, _facts(analysis, kernel="k1")) == "nb:a"  # the same kernel
    assert choose(records, _facts(analysis, kernel="k2")) == "nb:a"  # reopened: cells, inode
    # The next new notebook reuses the name: no cells yet, another file.
    assert choose(records, _facts(_save(untitled), kernel="k3")) is None
    # Reopened after that: still found (the old path now holds another notebook).
    assert choose(records, _facts(analysis, kernel="k4")) == "nb:a"
    # A copy (File > Duplicate) shares the cells, but the original is still where it was.
    records = {"nb:a": _record(analysis, kernel="k1")}
    copy = _save(tmp_path / "analysis-Copy1.ipynb", "c1", "c2")
    assert choose(records, _facts(copy, kernel="k5")) is None
    assert choose(records, _facts(analysis, kernel="k6")) == "nb:a"


def test_a_replaced_file_is_known_by_its_cells_a_recreated_one_is_new(tmp_path):
    from ania_nb.notebook._identity import choose

    path = _save(tmp_path / "report.ipynb", "c1")
    records = {"nb:r": _record(path, cell="c9")}
    path.unlink()
    _save(tmp_path / "report.ipynb", "c9", "c10")  # a git checkout: new file, same cells
    assert choose(records, _facts(path)) == "nb:r"
    path.unlink()
    _save(tmp_path / "report.ipynb", "d1")  # deleted and written anew: another notebook
    assert choose(records, _facts(path)) is None


def test_a_notebook_remembers_a_bounded_set_of_cells(tmp_path):
    from ania_nb.notebook._identity import MAX_CELLS, update

    path = _save(tmp_path / "big.ipynb", *(f"c{i:03}" for i in range(100)))
    record = _record(path, cell="running")
    assert len(record["cells"]) == MAX_CELLS and record["cells"][-1] == "running"
    facts = _facts(path)
    facts.cells, facts.cell_id = set(), "next"
    again = update(record, facts)
    assert again["cells"][-2:] == ["running", "next"] and len(again["cells"]) == MAX_CELLS


def test_a_notebook_adopts_its_pre_id_conversation_but_never_an_untitled_one(
    shell, llm, tmp_path, monkeypatch
):
    llm.script(*(reply(word) for word in ("one", "two", "three", "four")))
    run(shell, "%%agent -q -s nb:analysis\nasked before notebooks had ids")
    run(shell, "%%agent -q -s nb:Untitled\nasked in some other Untitled notebook")
    # The kernel of analysis.ipynb (Jupyter sets JPY_SESSION_NAME; no server to ask here).
    monkeypatch.setenv("JPY_SESSION_NAME", str(_save(tmp_path / "analysis.ipynb", "c1")))
    _, captured = run(shell, "%ania plan status")  # %ania commands use the notebook's session
    assert "plan mode is off for nb:analysis" in captured.stdout
    value, _ = run(shell, "%%agent -q\nand now?")
    assert value.session == "nb:analysis"
    assert roles(llm.requests[2]) == ["system", "user", "assistant", "user"]
    # A new Untitled notebook (as a fresh kernel sees it) does not inherit nb:Untitled.
    monkeypatch.setenv("JPY_SESSION_NAME", str(_save(tmp_path / "Untitled.ipynb")))
    state_of(shell)._session = None  # what a new kernel starts with
    value, _ = run(shell, "%%agent -q\nhello")
    assert value.session.startswith("nb:") and value.session not in ("nb:Untitled", "nb:analysis")
    assert roles(llm.requests[3]) == ["system", "user"]


def test_the_status_panel_of_a_real_notebook_creates_no_store(shell, llm, tmp_path, monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", str(_save(tmp_path / "fresh.ipynb", "c1")))
    data = Path(state_of(shell).overrides["store.data_dir"])
    _, captured = run(shell, "%ania")
    assert "  session   a new conversation, chosen by the first %%agent" in captured.stdout
    assert not data.exists()  # looking does not create the store
    llm.script(reply("hi"))
    value, _ = run(shell, "%%agent -q\nhello")
    _, captured = run(shell, "%ania")
    assert f"  session   {value.session}\n" in captured.stdout and data.is_dir()


@pytest.mark.parametrize(
    ("cell", "message"),
    [
        ("%%agent some words\nhi", "%%agent takes the prompt from the cell body, not the option"),
        ("%agent -q", "the following arguments are required: prompt"),
    ],
)
def test_a_prompt_in_the_wrong_place_is_one_line(shell, cell, message):
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        result = shell.run_cell(cell)
    assert not result.success
    assert message in captured.stderr and "Traceback" not in captured.stderr


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"llm.base_url": "https://api.example.com/v1", "llm.api_key": ""}, "llm.api_key is empty"),
        ({"llm.base_url": "http://127.0.0.1:{port}/v1"}, "cannot reach the model endpoint"),
    ],
)
def test_a_first_run_that_cannot_work_says_why_at_once(shell, llm, settings, said):
    from IPython.utils.capture import capture_output

    port = _closed_port()
    state_of(shell).overrides.update({k: v.format(port=port) for k, v in settings.items()})
    with capture_output() as captured:
        result = shell.run_cell("%%agent\nhello")
    assert not result.success
    assert said in captured.stderr and "%ania config set llm." in captured.stderr
    assert "Traceback" not in captured.stderr and widgets(captured) == []
    assert llm.requests == []


def test_a_config_change_cancels_the_background_runs_of_the_closed_agent(shell, llm):
    from ania_nb.notebook.widgets import RunView

    release = held(llm)
    shell.user_ns["first_request"] = lambda: llm.wait_for_requests(1)
    try:
        run(shell, "%%agent --bg\nslow task of the old agent")
        run(shell, "import asyncio\nseen = await asyncio.to_thread(first_request)")
        run(shell, "tasks = background()")
        run(shell, "%ania config set agent.max_iterations=7")  # closes the Agent it ran on
        run(shell, "done, pending = await asyncio.wait(tasks, timeout=20)")
    finally:
        release.set()
    [task] = shell.user_ns["done"]
    assert task.cancelled()  # cancelled with its Agent, not left to end on its own
    assert "_" not in shell.user_ns  # no result of the closed Agent's run lands in _
    views = [o for o in gc.get_objects() if isinstance(o, RunView)]
    [view] = [v for v in views if v.prompt == "slow task of the old agent"]
    assert view.status == "stopped" and not view.live


def test_a_background_run_stopped_by_ania_stop_ends_its_view(shell, llm):
    from ania_nb.notebook.widgets import RunView

    release = held(llm)
    shell.user_ns["first_request"] = lambda: llm.wait_for_requests(1)
    try:
        _, captured = run(shell, "%%agent --bg\nslow task with a view")
        assert widgets(captured)
        run(shell, "import asyncio\nseen = await asyncio.to_thread(first_request)")
        run(shell, "tasks = background()")
        run(shell, "%ania stop")
        run(shell, "done, pending = await asyncio.wait(tasks, timeout=20)")
    finally:
        release.set()
    # The view is only in the kernel's widget registry; find it by its prompt.
    views = [o for o in gc.get_objects() if isinstance(o, RunView)]
    [view] = [v for v in views if v.prompt == "slow task with a view"]
    assert view.status == "stopped" and not view.live


def test_ania_mcp_lists_prompts_and_a_cell_runs_one(shell, llm, tmp_path):
    from mcp_servers.support import stdio_entry

    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"servers": [stdio_entry("demo", prompts=True)]}))
    state_of(shell).overrides.update({"mcp.config_file": str(config)})
    _, captured = run(shell, "%ania mcp")
    assert (
        "prompts (run one in a %%agent cell): /demo:broken, /demo:chat-log, /demo:review"
        in captured.stdout
    )
    llm.script(reply("reviewed"))
    run(shell, '%%agent -q\n/demo:review "x = 1" language=go')
    user = [m for m in llm.requests[0].messages if m["role"] == "user"][-1]["content"]
    assert "Please review this go code:\nx = 1" in str(user)
    run(shell, "%%agent -q\n/demo:review")  # bad input: the usage, no model call
    assert shell.user_ns["_"].text.startswith("/demo:review needs code\nusage:")
    assert len(llm.requests) == 1


def test_ania_mcp_read_shows_a_resource_and_keeps_it_up_to_date(shell, llm, tmp_path):
    from mcp_servers.support import stdio_entry

    def shown(captured):
        return [(o.data.get("text/plain", ""), o.update) for o in captured.outputs]

    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"servers": [stdio_entry("demo", resources=True)]}))
    state_of(shell).overrides.update({"mcp.config_file": str(config)})
    _, captured = run(shell, "%ania mcp read demo memo://note")
    assert shown(captured) == [("note v0", False)]
    assert "(kept up to date: demo sends updates of memo://note)" in captured.stdout
    _, captured = run(shell, "%ania mcp read demo memo://logo.png")  # an image, as an image
    assert "image/png" in captured.outputs[-1].data
    demo = state_of(shell).agent().mcp.get("demo")
    outputs = []

    async def bump():
        from IPython.core.getipython import get_ipython

        pub = get_ipython().display_pub  # this cell's capture: updates of earlier outputs too
        await demo.call("bump_note", {}, generation=demo.generation)
        await until(lambda: any(o["update"] for o in pub.outputs), "the note to be re-shown")
        outputs.extend(pub.outputs)

    shell.user_ns["bump"] = bump
    run(shell, "await bump()")
    assert [(o["data"]["text/plain"], o["update"]) for o in outputs] == [("note v1", True)]
    _, captured = run(shell, "%ania mcp read demo memo://gone")
    assert "refused resources/read 'memo://gone'" in captured.stderr
