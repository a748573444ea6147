"""The cell tools in IPython's own shell.

``notebook_cells`` shows sources, returned values and the last error's traceback; ``propose_cell``
fills a new cell via ``set_next_input`` and is allowed in plan mode.
"""

from __future__ import annotations

import sys

import pytest

from ania_nb.notebook.tools import cell_tools, last_error
from ania_nb.testing import reply, tool_call


@pytest.fixture
def ip():
    """IPython's own shell (cells are run in the test itself: pytest clears ``sys.last_value``
    between a fixture and the test)."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    yield shell
    # The shell is a process-wide singleton: later tests' display hook re-reads the last stored
    # cell, which must not be this module's syntax error.
    shell.run_cell("pass", store_history=True)
    for name in ("last_type", "last_value", "last_traceback"):
        sys.__dict__.pop(name, None)
    shell.rl_next_input = None


def numbers(ip) -> tuple[int, int, int]:
    """Run three cells into the history (a value, a returned value, an error raised two frames
    deep); return their In[n] numbers."""
    for code in ("x = 6", "x * 7", "def f():\n    return 1 / 0\n\nf()"):
        ip.run_cell(code, store_history=True)
    last = ip.execution_count - 1
    return last - 2, last - 1, last


async def cells_seen(llm, make_agent, ip, arguments: dict | None = None) -> str:
    """Run a chat whose model calls notebook_cells; return what the tool answered."""
    llm.script(reply(tool_calls=[tool_call("notebook_cells", arguments or {})]), reply("I see"))
    agent = make_agent(tools=cell_tools(ip))
    result = await agent.chat("fix the error above")
    assert result.status == "success", result.error
    [call] = result.tool_calls
    assert call.error is None
    assert llm.requests[-1].messages[-1]["content"] == call.result  # what the model got
    return call.result


async def test_notebook_cells_shows_sources_values_and_the_last_traceback(llm, make_agent, ip):
    first, second, third = numbers(ip)
    seen = await cells_seen(llm, make_agent, ip)
    assert f"In [{first}]:\nx = 6" in seen
    assert f"In [{second}]:\nx * 7\nOut[{second}]: 42" in seen
    assert f"In [{third}]:\ndef f():\n    return 1 / 0\n\nf()" in seen
    assert f"Last error (raised in In[{third}]):\nTraceback (most recent call last):" in seen
    assert f'File "Cell In[{third}]", line 4, in <module>' in seen
    assert f'File "Cell In[{third}]", line 2, in f' in seen
    assert seen.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "interactiveshell.py" not in seen  # IPython's own frames are left out


async def test_notebook_cells_shows_one_cell_by_number_and_names_a_missing_one(llm, make_agent, ip):
    first, second, _ = numbers(ip)
    seen = await cells_seen(llm, make_agent, ip, {"cell": second})
    assert seen.startswith(f"In [{second}]:\nx * 7\nOut[{second}]: 42")
    assert f"In [{first}]" not in seen
    llm.requests.clear()
    missing = await cells_seen(llm, make_agent, ip, {"cell": 9999})
    assert missing.startswith("no cell In[9999]; cells run in this kernel: In[")


async def test_notebook_cells_limits_the_count_and_lists_agent_cells_by_their_first_line(
    llm, make_agent, ip
):
    _, second, third = numbers(ip)
    ip.run_cell("%%agent -q\nwhat is x?\nplease", store_history=True)  # not loaded: an error
    agent_cell = ip.execution_count - 1
    seen = await cells_seen(llm, make_agent, ip, {"count": 2})
    assert f"In [{agent_cell}]: %%agent -q  (an agent cell)" in seen
    assert "what is x?\nplease" not in seen  # the prompt itself is in the history already
    assert f"In [{third}]:" in seen and f"In [{second}]:" not in seen


def test_last_error_is_none_before_any_error(ip):
    numbers(ip)
    for name in ("last_type", "last_value", "last_traceback"):
        sys.__dict__.pop(name, None)
    assert last_error(ip) is None


async def test_propose_cell_fills_the_next_cell_and_runs_nothing_even_in_plan_mode(
    llm, make_agent, ip
):
    ip.run_cell("1", store_history=True)
    code = "import math\nprint(math.sqrt(2))"
    llm.script(
        reply(tool_calls=[tool_call("propose_cell", {"code": code})]),
        reply(tool_calls=[tool_call("propose_cell", {"code": "y = 2"})]),
        reply("proposed"),
    )
    agent = make_agent(tools=cell_tools(ip))
    ip.user_ns.pop("y", None)
    result = await agent.chat("write the code, do not run it", plan=True)
    assert result.status == "success", result.error
    assert [c.error for c in result.tool_calls] == [None, None]
    assert result.tool_calls[0].result.startswith("proposed a new cell below with 2 line(s)")
    assert ip.rl_next_input == code + "\n\ny = 2"  # one cell: the kernel keeps one proposal
    assert "y" not in ip.user_ns  # nothing ran


async def test_propose_cell_refuses_empty_code(llm, make_agent, ip):
    llm.script(reply(tool_calls=[tool_call("propose_cell", {"code": "\n  \n"})]), reply("ok"))
    agent = make_agent(tools=cell_tools(ip))
    ip.rl_next_input = None
    result = await agent.chat("propose nothing")
    assert result.tool_calls[0].error == "code must not be empty"
    assert ip.rl_next_input is None


async def test_a_syntax_error_is_shown_without_ipythons_frames(llm, make_agent, ip):
    ip.run_cell("def g(:\n    pass", store_history=True)
    seen = await cells_seen(llm, make_agent, ip, {"count": 1})
    error = seen.split("Last error", 1)[1]
    assert "SyntaxError" in error and "def g(:" in error
    assert "interactiveshell.py" not in error and "IPython" not in error


async def test_a_long_traceback_keeps_its_end(ip):
    chain = "".join(f"def f{i}():\n    return f{i + 1}()  # {'x' * 60}\n" for i in range(40))
    ip.run_cell(chain + "def f40():\n    return {}['missing']\n\nf0()", store_history=True)
    error = last_error(ip)
    assert error is not None and "...(earlier frames cut)" in error
    assert error.rstrip().endswith("KeyError: 'missing'")
    assert "in f40" in error and "in f1\n" not in error
