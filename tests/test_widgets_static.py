"""Issue 19 in the run view, over real Agent runs: code shown as highlighted code (approval card,
tool row), the approval wait apart from the tool's time, honest statuses, SVG icons, the static
HTML a saved notebook keeps (also through a real kernel and ``jupyter nbconvert --to html``), the
log table's columns and "1 LLM call"."""

from __future__ import annotations

import asyncio
import html
import json
import re
import subprocess
import sys
from pathlib import Path

from _waits import until

from ania_nb import tool
from ania_nb.notebook.widgets import LogView, RunView
from ania_nb.notebook.widgets._code import arguments_html, code_block, expected_details
from ania_nb.notebook.widgets._format import usage_text
from ania_nb.notebook.widgets.children import tokens_text
from ania_nb.result import outcome_text
from ania_nb.testing import reply, tool_call, usage

GATED = {"approval.enable": True, "approval.tools": ["python", "bash"]}
LONG_CODE = "\n".join(f"value_{n} = {n} * 2  # line {n}" for n in range(1, 41))
# Emoji and symbols missing from DejaVu Sans: a stock Debian Chromium shows them as boxes.
NO_FONT = re.compile("[\u23f1\u26d4\u2b07\U0001f300-\U0001faff]")


@tool(name="python", side_effects=True)
def python_tool(code: str) -> str:
    """Run Python code."""
    return f"ran {code.count(chr(10)) + 1} lines"


@tool(name="bash", side_effects=True)
def bash_tool(command: str, env: dict[str, str] | None = None) -> str:
    """Run a shell command."""
    return "ok"


bash_tool.shell_arguments = ("command",)  # as the built-in bash: approvals split the line


@tool
def write_file(path: str, content: str) -> str:
    """Write a file."""
    return f"wrote {len(content)} characters"


def start(agent, view: RunView, prompt: str = "go") -> asyncio.Task:
    return asyncio.create_task(agent.chat(prompt, session=view.session, callbacks=view.callbacks))


def code_lines(fragment: str) -> list[str]:
    """The text of each line of the first code block in an HTML fragment (tags stripped)."""
    block = fragment.split('<div class="ania-code"', 1)[1].split("</pre>", 1)[0]
    body = block.split("<pre", 1)[1].split(">", 1)[1]
    return [html.unescape(re.sub(r"<[^>]+>", "", line)) for line in body.split("\n")]


# ------------------------------------------------------------------ code looks like code


async def test_the_approval_card_shows_40_lines_of_python_as_numbered_highlighted_code(
    llm, make_agent
):
    agent = make_agent(tools=[python_tool], overrides=GATED)
    llm.script(reply(tool_calls=[tool_call("python", {"code": LONG_CODE})]), reply("done"))
    view = RunView(agent, session="nb:code")
    task = start(agent, view)
    await until(lambda: view.cards, "the approval card")
    [card] = view.cards.values()
    shown = card.details.value
    assert '<div class="ania-code" data-language="python"' in shown
    assert "<b>code</b> <small>(40 lines)</small>" in shown
    lines = code_lines(shown)
    assert len(lines) == 40  # every line, none flattened or cut
    assert lines[0] == "1value_1 = 1 * 2  # line 1"  # numbered (the number is its own span)
    assert lines[-1] == "40value_40 = 40 * 2  # line 40"
    assert "\\n" not in shown and "&quot;code&quot;" not in shown  # no escaped JSON
    assert 'style="color:' in shown  # Pygments' inline colours (no stylesheet needed)
    assert "overflow:auto" in shown  # a long call scrolls inside the card
    assert card.summary.value == ""  # python's summary is the code flattened: not repeated
    [row] = view.tool_rows.values()
    assert row.awaiting_approval
    title = "⚙ python(code=value_1 = 1 * 2 # line 1 …(40 lines)) · waiting for approval…"
    assert row.title() == title  # the first line and the count, not 40 lines flattened
    card.allow_button.click()
    view.finish(await task)
    assert row.state == "ok" and code_lines(row.widget.value)[-1].endswith("# line 40")


async def test_bash_and_multiline_arguments_are_code_in_the_card_and_the_row(llm, make_agent):
    agent = make_agent(tools=[bash_tool, write_file], overrides=GATED)
    command = "cd /tmp && ls -l\necho done"
    llm.script(
        reply(
            tool_calls=[
                tool_call("bash", {"command": command, "env": {"TOKEN": "hunter2secret"}}),
                tool_call("write_file", {"path": "a.py", "content": "x = 1\nprint(x)\n"}),
            ]
        ),
        reply("done"),
    )
    view = RunView(agent, session="nb:bash")
    task = start(agent, view)
    await until(lambda: view.cards, "the approval card")
    [card] = view.cards.values()
    shown = card.details.value
    assert 'data-language="bash"' in shown and code_lines(shown) == command.split("\n")
    assert "it runs 3 commands:" in shown  # the shell line split, as in the gate's text
    assert "hunter2secret" not in shown and "TOKEN" in shown  # env values masked, names shown
    card.allow_button.click()
    view.finish(await task)
    rows = list(view.tool_rows.values())
    assert "hunter2secret" not in rows[0].widget.value
    assert 'data-language="python"' in rows[1].widget.value  # the file's type picks the lexer
    assert code_lines(rows[1].widget.value) == ["x = 1", "print(x)", ""]
    assert "<b>path</b>: <code" in rows[1].widget.value  # a one-line value stays a field


def test_hidden_characters_in_code_are_shown_not_obeyed():
    shown = arguments_html("python", json.dumps({"code": "ok = 1  # \u202eevil\u200b\nx"}))
    assert "\u202e" not in shown and "\\u202e" in shown and "\\u200b" in shown
    assert arguments_html("x", "not json").startswith("<small>(the arguments are not a JSON")
    assert len(code_lines(code_block("a\nb", "nosuchlanguage"))) == 2  # unknown lexer: plain


# ------------------------------------------------------------- approval wait, honest status


async def test_the_approval_wait_is_shown_apart_from_the_tools_own_time(llm, make_agent):
    agent = make_agent(tools=[python_tool], overrides=GATED)
    llm.script(reply(tool_calls=[tool_call("python", {"code": "1 + 1"})]), reply("two"))
    view = RunView(agent, session="nb:wait")
    task = start(agent, view)
    await until(lambda: view.cards, "the approval card")
    [card] = view.cards.values()
    card.allow_button.click()
    result = await task
    view.finish(result)
    [row] = view.tool_rows.values()
    [call] = result.tool_calls
    assert row.duration_ms == call.duration_ms  # the executor's time: the wait is not in it
    assert row.waited is not None and row.waited == card.waited
    assert " · approval wait " in row.title() and "; approval wait " in row.widget.value
    assert "(after " in card.verdict.value  # the card says how long it waited


async def test_a_run_with_a_denied_call_says_finished_not_success(llm, make_agent):
    agent = make_agent(tools=[python_tool], overrides=GATED)
    llm.script(reply(tool_calls=[tool_call("python", {"code": "rm()"})]), reply("Not run."))
    view = RunView(agent, session="nb:deny", prompt="try")
    task = start(agent, view)
    await until(lambda: view.cards, "the approval card")
    next(iter(view.cards.values())).deny_button.click()
    view.finish(await task)
    assert view.status == "success"  # the run itself succeeded …
    assert view.headline() == ("finished", "finished · 1 call denied")  # … but not as asked
    assert ">finished · 1 call denied</b>" in view.status_label.value
    assert 'aria-label="finished · 1 call denied"' in view.status_label.value
    assert "success" not in view.status_label.value
    assert view.text().startswith("⚠ finished · 1 call denied · nb:deny · ")
    assert ">finished · 1 call denied</b>" in view.html()
    # One vocabulary: the stored record says the same in %ania log and `ania-nb runs`.
    from ania_nb.notebook.widgets.log import record_headline

    [record] = await agent.runs(session="nb:deny")
    assert [call.outcome for call in record.tool_calls] == ["denied"]
    assert record_headline(record) == view.headline()
    log = LogView(agent, session="nb:deny")
    await log.refresh()
    assert "⚠ finished · 1 call denied" in log.text() and "success" not in log.text()


def test_outcome_words_and_singular_counts():
    assert outcome_text(["ok", "denied", "error", "error", "blocked"]) == (
        "1 call denied, 1 call blocked, 2 calls failed"
    )
    assert outcome_text(["ok", "ok"]) == ""
    one = {"total_tokens": 10, "prompt_tokens": 8, "completion_tokens": 2, "iterations": 1}
    assert usage_text(one).endswith(" · 1 LLM call")
    assert usage_text({**one, "iterations": 2}).endswith(" · 2 LLM calls")
    assert tokens_text(one) == "10 tokens · 1 LLM call"


# --------------------------------------------------------------- icons and the static HTML


async def test_icons_are_svg_and_the_finished_run_is_static_html(llm, make_agent):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.display import display
    from IPython.utils.capture import capture_output

    InteractiveShell.instance()
    agent = make_agent(tools=[python_tool], overrides=GATED)
    llm.script(
        reply("Computing.", tool_calls=[tool_call("python", {"code": "a = 1\nb = 2"})]),
        reply("The answer is **3**.", usage=usage(30, 4)),
    )
    view = RunView(agent, session="nb:static", prompt="add <them>")
    with capture_output() as captured:
        display(view)
        task = start(agent, view)
        await until(lambda: view.cards, "the approval card")
        next(iter(view.cards.values())).allow_button.click()
        view.finish(await task)
    shown, *_, final = captured.outputs
    assert "application/vnd.jupyter.widget-view+json" in shown.data
    assert set(final.data) == {"text/html", "text/plain"}
    page = final.data["text/html"]
    assert "› add &lt;them&gt;" in page  # the prompt, escaped
    assert "Computing." in page  # intermediate text
    assert '<details class="ania-tool" data-state="ok">' in page  # the tool row …
    assert code_lines(page.split("ania-tool", 1)[1]) == ["a = 1", "b = 2"]  # … with its code
    assert "allowed — approved by the user" in page  # the approval card, without buttons
    assert page.count("<button disabled") == page.count("<button") == 3  # nothing to click
    assert "The answer is <strong>3</strong>." in page  # the reply as Markdown
    assert re.search(r"\d+ tokens \(in \d+ · cached 0 · out \d+\) · 2 LLM calls", page)
    assert "<svg" in page and not NO_FONT.search(page)
    for html_text in (view.status_label.value, *(r.widget.value for r in view.tool_rows.values())):
        assert not NO_FONT.search(html_text)


async def test_log_columns_do_not_wrap(llm, make_agent):
    agent = make_agent()
    llm.script(reply("one"), reply("two"))
    await agent.chat("a question long enough " * 8, session="nb:log")
    await agent.chat("short", session="nb:log")
    view = LogView(agent)
    await view.refresh()
    table = view.table.value
    cells = re.findall(r"<t[dh] style=\"([^\"]*)\"", table)
    assert len(cells) == 8 * 3 and all("white-space:nowrap" in style for style in cells)
    assert "overflow-x:auto" in table and "width:max-content" in table
    assert re.search(r"<td [^>]*>\d\d-\d\d \d\d:\d\d:\d\d</td>", table)  # the date, one cell
    assert 'title="' + ("a question long enough " * 8).strip() + '"' in table  # full input
    assert '<svg class="ania-icon ania-icon-check"' in table and "✓" not in table


# ------------------------------------------------------- a real kernel, then nbconvert


def test_nbconvert_html_of_the_executed_quickstart_contains_the_runs(tmp_path: Path):
    import nbformat  # here, not at the top: the fast run (-m "not slow") never pays for them
    from nbclient import NotebookClient

    quickstart = Path(__file__).resolve().parents[1] / "notebooks" / "quickstart.ipynb"
    nb = nbformat.read(quickstart, as_version=4)
    [config] = [c for c in nb.cells if "approval.timeout=10 " in c.source]
    # Nobody is there to click Allow: let python run without asking.
    config.source = config.source.replace("approval.timeout=10 ", "notebook.python_approval=false ")
    for cell in nb.cells:
        cell.outputs = [] if cell.cell_type == "code" else None
        if cell.cell_type != "code":
            del cell["outputs"]
    # A real kernel runs it.
    NotebookClient(nb, timeout=90, resources={"metadata": {"path": str(tmp_path)}}).execute()
    runs = [c for c in nb.cells if c.source.startswith("%%agent")]
    for cell in runs:
        [output] = cell.outputs
        assert set(output["data"]) == {"text/html", "text/plain"}  # the final update was kept
    path = tmp_path / "quickstart.ipynb"
    nbformat.write(nb, path)
    subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    page = (tmp_path / "quickstart.html").read_text(encoding="utf-8")
    assert "Error displaying widget" not in page
    assert "› How many units did each region sell?" in page  # the first run's prompt …
    assert "notebook_vars(name=sales)" in page  # … its tool rows …
    assert "python(code=totals = {} …(4 lines))" in page
    assert 'data-language="python"' in page  # … the code as code …
    reply_html = "Units sold per region: <code>{'north': 380, 'south': 313}</code>"
    assert reply_html in page  # … and the reply as Markdown
    assert "Plan saved: one step done, one in progress, one to go." in page  # the second run
    assert "LLM calls" in page and ">success</b>" in page


def test_plain_text_glyphs_are_in_dejavu_sans():
    from ania_nb.notebook.widgets import approval, children, run, tools
    from ania_nb.notebook.widgets._format import STATUS_ICONS, TODO_ICONS

    # Checked with `fc-list ':charset=XXXX'` on Debian: DejaVu Sans has each of these.
    dejavu = set("◐✓⚠■◷✗⊘⚙○●") | set(run.SPINNER)
    tables = (STATUS_ICONS, TODO_ICONS, tools.ICONS, approval.GLYPHS, children.ICONS)
    used = {glyph for table in tables for glyph in table.values()} | set(run.SPINNER)
    assert used <= dejavu, used - dejavu


async def test_the_run_record_view_shows_stored_code_as_code(llm, make_agent):
    import pytest

    from ania_nb.errors import UsageError
    from ania_nb.notebook.widgets.record import record_view

    agent = make_agent(tools=[write_file])
    content = "def f():\n    return 1\n"
    llm.script(
        reply(tool_calls=[tool_call("write_file", {"path": "f.py", "content": content})]),
        reply("Wrote **f.py**."),
    )
    await agent.chat("write f.py", session="nb:rec")
    [record] = await agent.runs(session="nb:rec")
    view = await record_view(agent, record.id)
    bundle = view._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain"}  # static: no widget to lose
    page = bundle["text/html"]
    assert 'data-language="python"' in page
    assert code_lines(page) == ["def f():", "    return 1", ""]
    assert "Wrote <strong>f.py</strong>." in page and "</small> write f.py</div>" in page
    assert f"#{record.id} · nb:rec · " in page and "2 LLM calls" in page
    lines = view.text().splitlines()
    assert lines[0].startswith(f"✓ success · #{record.id} · nb:rec · ")
    assert lines[2].startswith("  ✓ write_file(path=f.py, content=def f(): …(3 lines)) → wrote")
    assert lines[3:8] == [  # the code with its line breaks, under its argument's name
        "      content:",
        "          def f():",
        "              return 1",
        "",
        "      path: f.py",
    ]
    with pytest.raises(UsageError, match=r"no run #999 in the run log"):
        await record_view(agent, 999)


async def test_abort_ends_a_view_whose_run_raised(llm, make_agent):
    agent = make_agent(tools=[python_tool], overrides=GATED)
    llm.script(reply(tool_calls=[tool_call("python", {"code": "1"})]), reply("never"))
    view = RunView(agent, session="nb:abort")
    task = start(agent, view)
    await until(lambda: view.cards, "the approval card")
    view.abort("the kernel's event loop went away")  # e.g. agent.chat raised
    [card], [row] = view.cards.values(), view.tool_rows.values()
    assert card.state == "stopped" and card.disabled and row.state == "stopped"
    assert not view.live and view._ticker is None
    assert view.text().startswith("✗ error · nb:abort · ")
    assert "the kernel&#x27;s event loop went away" in view.html()
    assert set(view._repr_mimebundle_()) == {"text/html", "text/plain"}
    agent.stop("nb:abort")
    await task


def test_the_knowledge_line_in_the_run_view_uses_svg_icons():
    from ania_nb.notebook.widgets.run import injected_html, injected_text

    data = {
        "chunks": [{"doc_id": "d", "title": "Guide", "score": 0.8}],
        "memories": [{"content": "Alice likes tea"}],
    }
    line = injected_html(data)
    assert 'aria-label="knowledge"' in line and 'aria-label="memory"' in line
    assert not NO_FONT.search(line) and "Guide" in line and "Alice likes tea" in line
    assert injected_text(data).startswith("📚 injected: ")  # plain text (terminals) keeps it


def test_every_icon_is_well_formed_svg():
    import xml.etree.ElementTree as ET

    from ania_nb.notebook.widgets._icons import _SHAPES, STATES, icon

    for name in [*STATES, *_SHAPES]:
        svg = ET.fromstring(icon(name))  # a duplicate attribute or bad nesting raises
        assert svg.tag == "svg" and svg.get("aria-label") == name and len(svg) >= 1


async def test_parallel_calls_of_one_tool_each_card_shows_its_own_call(llm, make_agent):
    agent = make_agent(tools=[python_tool], overrides=GATED)
    first, second = "a = 1\nprint(a)", "b = 2\nprint(b)"
    llm.script(
        reply(
            tool_calls=[
                tool_call("python", {"code": first}),
                tool_call("python", {"code": second}),
            ]
        ),
        reply("both ran"),
    )
    view = RunView(agent, session="nb:two")
    task = start(agent, view)
    await until(lambda: len(view.tool_rows) == 2 and view.cards, "two rows and a card")
    # Both calls run at once; their questions come one at a time, in either order.
    for _ in range(2):
        await until(lambda: any(c.state == "pending" for c in view.cards.values()), "a card")
        card = next(c for c in view.cards.values() if c.state == "pending")
        row = view._card_rows[card.request.id]
        assert card.arguments == row.arguments and card.request.details.count("print(") == 1
        shown = code_lines(card.details.value)
        assert shown == json.loads(row.arguments)["code"].split("\n")
        card.allow_button.click()
        await until(lambda c=card: c.state == "allowed", "the answer")
    view.finish(await task)
    assert {r.state for r in view.tool_rows.values()} == {"ok"}
    assert all(r.waited is not None for r in view.tool_rows.values())


def test_a_card_is_matched_to_its_call_by_the_gates_text():
    from ania_nb.engine.callbacks import ApprovalRequest
    from ania_nb.notebook.widgets.approval import row_asking
    from ania_nb.notebook.widgets.tools import ToolRow

    class NoTools:  # an agent whose tool table does not know the tool (session-only tool)
        tools = type("T", (), {"get": staticmethod(lambda name: None)})()

    rows = [
        ToolRow(str(n), "python", json.dumps({"code": f"x = {n}\nprint(x)"}), widget=False)
        for n in range(3)
    ]
    for n in (2, 0, 1):
        details = expected_details("python", rows[n].arguments)
        request = ApprovalRequest("r", "s", "python", "run Python", details=details)
        assert row_asking(NoTools(), request, rows) is rows[n]
    unknown = ApprovalRequest("r", "s", "python", "run Python", details="something else")
    assert row_asking(NoTools(), unknown, rows) is None  # ambiguous: no guess
    assert row_asking(NoTools(), unknown, rows[:1]) is rows[0]  # the only candidate


async def test_the_static_html_nests_a_subagents_transcript_under_its_row(make_agent):
    from ania_nb import RunEvent, RunResult

    view = RunView(make_agent(), session="nb:kids", prompt="delegate")

    def child(kind: str, background: bool = False, **data: object) -> RunEvent:
        shaped = {"call_id": "c1", "child_id": "k1", "label": "helper", "kind": kind}
        return RunEvent("child", "nb:kids", {**shaped, "data": data, "background": background})

    view.on_event(RunEvent("tool_start", "nb:kids", {"id": "c1", "name": "subagent_run",
                                                     "arguments": '{"task": "dig"}'}))  # fmt: skip
    view.on_event(child("child_start", role="digger", task="dig deep"))
    view.on_event(child("tool_start", id="t1", name="bash", arguments='{"command": "ls\\npwd"}'))
    view.on_event(child("tool_end", id="t1", name="bash", arguments='{"command": "ls\\npwd"}',
                        result="a b", error=None, duration_ms=5, outcome="ok"))  # fmt: skip
    view.on_event(child("child_end", status="success", text="Found **it**.", elapsed=1.5, usage={}))
    view.on_event(RunEvent("tool_end", "nb:kids", {"id": "c1", "name": "subagent_run",
                                                   "arguments": "{}", "result": "Found it.",
                                                   "error": None, "duration_ms": 1500,
                                                   "outcome": "ok"}))  # fmt: skip
    view.finish(RunResult(text="Done.", status="success", session="nb:kids"))
    page = view.html()
    nested = page.split('data-state="ok">', 1)[1]  # after the subagent_run row
    assert "helper (digger) · success · 1.5 s" in nested and "dig deep" in nested
    assert code_lines(nested.split("ania-tool", 1)[1]) == ["ls", "pwd"]  # the child's bash code
    assert "Found <strong>it</strong>." in nested and nested.index("Found") < page.index("Done.")
    view.close()
