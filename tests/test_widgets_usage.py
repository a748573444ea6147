"""`UsagePanel` on a real Agent (scripted server, SQLite store): today's sessions against the
limits as progress bars, the daily plot (matplotlib PNG) and its numbers, costs, the Refresh
button; ``%ania usage`` (panel, text fallback without matplotlib) and ``%ania quota [reset]``
in a live IPython shell."""

from __future__ import annotations

import asyncio
import sys
from datetime import datetime, timedelta

import pytest

from ania_nb.engine.usage import Tokens
from ania_nb.notebook.widgets import UsagePanel
from ania_nb.notebook.widgets.usage import panel_available, period_cost
from ania_nb.testing import reply, usage

PNG = b"\x89PNG\r\n\x1a\n"
NOON = datetime.fromisoformat("2026-12-01T12:00:00+00:00").timestamp()
TODAY = "2026-12-01"
LIMITS = {
    "quota.timezone": "UTC",
    "quota.daily_tokens": 200,
    "quota.global_daily_tokens": 1000,
}


def day_before(days: int) -> str:
    return (datetime.fromisoformat(TODAY) - timedelta(days=days)).date().isoformat()


async def agent_at_noon(make_agent, **overrides):
    """An Agent whose quota clock says 2026-12-01 12:00 UTC (runs count on that day)."""
    agent = make_agent(overrides={**LIMITS, **overrides})
    agent.quota.now = lambda: NOON
    await agent.start()
    return agent


async def settled(panel: UsagePanel) -> None:
    async with asyncio.timeout(30):
        await panel.wait_actions()


async def test_panel_shows_sessions_against_the_limits_and_the_daily_plot(llm, make_agent):
    agent = await agent_at_noon(make_agent)
    llm.script(
        reply("a", usage=usage(200, 50, cached=120)),  # nb:a 250 of 200: over, red
        reply("b", usage=usage(150, 20)),  # nb:b 170: 85 %, orange
        reply("c", usage=usage(8, 2)),  # nb:c 10: 5 %
    )
    for session in ("nb:a", "nb:b", "nb:c"):
        assert (await agent.chat("hi", session=session)).ok
    store = await agent.host.open_store()
    await store.usage.add(day_before(2), "nb:a", {"scripted": Tokens(300, 100, 50, 400)})

    panel = await UsagePanel(agent.quota, days=5).refresh()
    assert [s.session for s in panel.report.sessions] == ["nb:a", "nb:b", "nb:c"]
    bars = {key: (round(bar.value), bar.bar_style) for key, bar in panel.bars.items()}
    assert bars == {
        "": (43, "success"),  # all sessions: 430 of 1,000
        "nb:a": (100, "danger"),  # 125 % is drawn full and red
        "nb:b": (85, "warning"),
        "nb:c": (5, "success"),
    }
    labels = [row.children[0].value for row in panel.session_box.children]
    assert labels[0] == "nb:a: 250 of 200 tokens (125%)"
    assert (
        panel.total_box.children[0].children[0].value == "all sessions: 430 of 1,000 tokens (43%)"
    )
    assert "2026-12-01" in panel.header.value and "resets at 00:00" in panel.header.value

    days = [day_before(n) for n in (4, 3, 2, 1, 0)]
    assert [d.day for d in panel.report.days] == days
    assert panel.plot_data == {
        "cached": [0, 0, 50, 0, 120],
        "prompt (not cached)": [0, 0, 250, 0, 358 - 120],
        "completion": [0, 0, 100, 0, 72],
    }
    assert bytes(panel.plot.value).startswith(PNG) and panel.plot.layout.display is None
    assert panel.plot_note.value == ""
    assert "cost" not in panel.day_table.value  # nothing priced: no cost column, no guess
    assert panel.day_table.value.index(days[-1]) < panel.day_table.value.index(days[0])

    text = panel.text()
    assert text == panel.report.to_text()
    assert panel._repr_mimebundle_()["text/plain"] == text
    assert "All sessions today: 430 tokens (limit 1,000)" in text
    panel.close()


async def test_a_bar_is_red_from_exactly_the_limit_and_orange_from_80_percent(llm, make_agent):
    agent = await agent_at_noon(make_agent)
    llm.script(
        reply("a", usage=usage(150, 50)),  # 200 of 200: used up, work is refused
        reply("b", usage=usage(150, 10)),  # 160: 80 %
        reply("c", usage=usage(150, 9)),  # 159: just under
    )
    for session in ("nb:a", "nb:b", "nb:c"):
        assert (await agent.chat("hi", session=session)).ok
    panel = await UsagePanel(agent.quota, days=1).refresh()
    styles = {key: bar.bar_style for key, bar in panel.bars.items() if key}
    assert styles == {"nb:a": "danger", "nb:b": "warning", "nb:c": "success"}
    panel.close()


async def test_refresh_button_rereads_the_store_and_redraws(llm, make_agent):
    agent = await agent_at_noon(make_agent)
    llm.script(reply("one", usage=usage(40, 10)), reply("two", usage=usage(90, 10)))
    await agent.chat("x", session="nb:a")
    panel = await UsagePanel(agent.quota, days=3).refresh()
    before = bytes(panel.plot.value)
    assert round(panel.bars["nb:a"].value) == 25 and panel.bars["nb:a"].bar_style == "success"

    await agent.chat("y", session="nb:a")  # 150 of 200 now
    assert round(panel.bars["nb:a"].value) == 25  # unchanged until refreshed
    panel.refresh_button.click()
    await settled(panel)
    assert round(panel.bars["nb:a"].value) == 75 and panel.plot_data["completion"][-1] == 20
    assert bytes(panel.plot.value) != before and bytes(panel.plot.value).startswith(PNG)
    assert panel.message == ""

    await agent.quota.reset("nb:a", actor="test")  # the counter goes, the history stays
    panel.refresh_button.click()
    await settled(panel)
    assert "nb:a" not in panel.bars and panel.plot_data["completion"][-1] == 20
    assert panel.session_box.children[0].value.endswith("no tokens counted today</small>")
    panel.close()


async def test_costs_per_day_when_every_model_is_priced(llm, make_agent):
    prices = {"scripted": {"input": 2.0, "output": 8.0}}
    agent = await agent_at_noon(make_agent, **{"pricing.models": prices})
    llm.script(reply("hi", usage=usage(500_000, 250_000)))  # 1.0 + 2.0
    await agent.chat("x", session="nb:a")
    store = await agent.host.open_store()
    await store.usage.add(day_before(1), "nb:a", {"scripted": Tokens(1_000_000, 0, 0, 1_000_000)})

    panel = await UsagePanel(agent.quota, days=3).refresh()
    table = panel.day_table.value
    assert "<th" in table and ">cost</th>" in table
    assert "$3.0000" in table and "$2.0000" in table and "cost over 3 days: $5.0000" in table
    assert period_cost(panel.report) == pytest.approx(5.0)

    # A day that used an unpriced model has no cost, and the period gets no total (no guess).
    await store.usage.add(day_before(2), "nb:a", {"unknown-model": Tokens(10, 10, 0, 20)})
    await panel.refresh()
    assert period_cost(panel.report) is None and "cost over" not in panel.day_table.value
    assert f"<td>{day_before(2)}</td>" in panel.day_table.value
    row = panel.day_table.value.split(f"<td>{day_before(2)}</td>")[1].split("</tr>")[0]
    assert row.endswith(">-</td>")
    panel.close()


async def test_one_session_and_no_limits(llm, make_agent):
    agent = await agent_at_noon(
        make_agent, **{"quota.daily_tokens": 0, "quota.global_daily_tokens": 0}
    )
    llm.script(reply("a", usage=usage(30, 5)), reply("b", usage=usage(60, 6)))
    await agent.chat("x", session="nb:a")
    await agent.chat("y", session="nb:b")
    panel = await UsagePanel(agent.quota, days=2, session="nb:b").refresh()
    assert panel.bars == {}  # no limit, nothing to fill
    (row,) = panel.session_box.children
    assert row.children[0].value == "nb:b: 66 tokens (no limit)"
    assert panel.total_box.children[0].children[0].value == "all sessions: 101 tokens (no limit)"
    assert panel.plot_data["prompt (not cached)"] == [0, 60]
    assert "session nb:b" in panel.text()
    with pytest.raises(ValueError, match="days must be at least 1"):
        UsagePanel(agent.quota, days=0)
    panel.close()


async def test_the_panel_shows_both_models_the_fallback_and_what_embeddings_cost(llm, make_agent):
    agent = await agent_at_noon(
        make_agent,
        **{
            "quota.daily_tokens": 100,
            "quota.fallback_model": "cheap",
            "embedding.provider": "none",
        },
    )
    llm.script(reply("a", usage=usage(150, 0)), reply("b", usage=usage(20, 4)))
    assert (await agent.chat("x", session="nb:a")).ok
    assert (await agent.chat("y", session="nb:a")).text.endswith("\n\nb")  # cheap answered
    panel = await UsagePanel(agent.quota, days=2).refresh()
    assert [(m.model, m.total, m.role) for m in panel.report.models] == [
        ("scripted", 150, "main"),
        ("cheap", 24, "quota fallback"),
    ]
    table = panel.model_table.value
    assert table.index("scripted") < table.index("cheap") and "quota fallback" in table
    notes = panel.notes_html.value
    assert "Quota fallback: cheap answers once a limit is used up" in notes
    assert "24 tokens today in all sessions" in notes
    assert "Embeddings: none (full-text search only): no tokens, no cost" in notes
    assert "Models today, all sessions:" in panel.text()
    panel.close()


async def test_counting_off_is_said_and_a_failed_refresh_is_shown(llm, make_agent):
    agent = await agent_at_noon(make_agent, **{"quota.enable": False})
    panel = await UsagePanel(agent.quota).refresh()
    assert "quota.enable is off" in panel.total_box.children[0].value
    assert len(panel.report.days) == 14 and bytes(panel.plot.value).startswith(PNG)
    long = await UsagePanel(agent.quota, days=45).refresh()  # fewer day labels, still drawn
    assert len(long.plot_data["completion"]) == 45 and bytes(long.plot.value).startswith(PNG)
    long.close()

    await agent.aclose()  # the store is gone: the button shows why instead of raising
    panel.refresh_button.click()
    await settled(panel)
    assert panel.message.startswith("✗ ") and "color:#c62828" in panel.message_html.value
    assert panel.message in panel.text()
    panel.close()


async def test_without_matplotlib_the_panel_has_no_plot(llm, make_agent, monkeypatch):
    agent = await agent_at_noon(make_agent)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    assert not panel_available()
    panel = await UsagePanel(agent.quota, days=2).refresh()
    assert bytes(panel.plot.value) == b"" and panel.plot.layout.display == "none"
    assert "matplotlib is not installed" in panel.plot_note.value
    panel.close()


# ------------------------------------------------------------------ %ania usage / %ania quota


@pytest.fixture
def shell(llm, tmp_path, monkeypatch):
    """A shell with ania_nb loaded and its Agent on the scripted server, quota day in UTC."""
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)  # the default session: nb:default
    monkeypatch.chdir(tmp_path)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "ania_nb")
    state = ip.magics_manager.registry["AgentMagics"].state
    state.overrides.update(
        {
            "llm.base_url": llm.base_url,
            "llm.api_key": llm.api_key,
            "llm.model": "scripted",
            "llm.stream": False,
            "store.data_dir": str(tmp_path / "data"),
            "skills.dir": str(tmp_path / "no-skills"),
            "mcp.config_file": str(tmp_path / "no-mcp.json"),
            "embedding.provider": "none",
            "kb.auto_inject": False,
            **LIMITS,
        }
    )
    yield ip
    if "AgentMagics" in ip.magics_manager.registry:
        ip.run_line_magic("unload_ext", "ania_nb")


def run(ip, code: str):
    """Run one cell; return its result and captured output (stdout, displays)."""
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        result = ip.run_cell(code)
    return result, captured


def shown_text(captured) -> str:
    return "".join(o.data.get("text/plain", "") for o in captured.outputs)


def chat(shell, llm, session: str, prompt: int, completion: int) -> None:
    state = shell.magics_manager.registry["AgentMagics"].state
    agent = state.agent()
    agent.quota.now = lambda: NOON
    llm.script(reply("ok", usage=usage(prompt, completion)))
    assert state.run_sync(agent.chat("hi", session=session)).ok


def test_ania_usage_shows_the_panel_or_the_text_table(shell, llm, monkeypatch):
    chat(shell, llm, "nb:default", 100, 20)
    chat(shell, llm, "nb:other", 30, 3)
    result, out = run(shell, "%ania usage --days 3")
    assert result.success, result.error_in_exec
    shown = shown_text(out)
    assert "Usage on 2026-12-01 (UTC); the day resets at 00:00" in shown
    assert "All sessions today: 153 tokens (limit 1,000)" in shown
    assert "last 3 days" in shown
    assert any("application/vnd.jupyter.widget-view+json" in o.data for o in out.outputs)

    _, out = run(shell, "%ania usage --session=nb:other")
    shown = shown_text(out)
    assert "Daily tokens, session nb:other, last 14 days" in shown and "nb:default" not in shown

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # the notebook extra without it
    result, out = run(shell, "%ania usage --days 2")
    assert result.success and out.outputs == []  # no widget, the table printed instead
    assert "All sessions today: 153 tokens (limit 1,000)" in out.stdout
    assert "last 2 days" in out.stdout and "needs ipywidgets and matplotlib" in out.stdout

    for bad, why in (
        ("--days 0", "--days must be at least 1, got 0"),
        ("--days two", "--days takes a whole number, got 'two'"),
        ("--days", "--days needs a value"),
        ("--weeks 2", "unknown %ania usage argument '--weeks'"),
    ):
        result, _ = run(shell, f"%ania usage {bad}")
        assert not result.success, bad
        assert why in str(result.error_in_exec) and "usage: %ania usage [--days N]" in str(
            result.error_in_exec
        )


def test_ania_quota_prints_today_and_resets_with_an_audit_entry(shell, llm):
    chat(shell, llm, "nb:default", 150, 60)  # 210 of 200: the next run is refused
    chat(shell, llm, "nb:other", 40, 0)
    state = shell.magics_manager.registry["AgentMagics"].state
    agent = state.agent()
    denied = state.run_sync(agent.chat("again", session="nb:default"))
    assert denied.status == "denied"

    _, out = run(shell, "%ania quota")
    assert "All sessions today: 250 tokens (limit 1,000)" in out.stdout
    assert "nb:default" in out.stdout and "105%" in out.stdout and "last 1 days" in out.stdout

    result, out = run(shell, "%ania quota reset")  # the notebook's own session
    assert result.success, result.error_in_exec
    assert (
        out.stdout.strip() == "reset today's (2026-12-01) quota of nb:default: 210 tokens cleared"
    )
    chat(shell, llm, "nb:default", 5, 0)  # the denial is lifted

    _, out = run(shell, "%ania quota reset all")
    assert (
        out.stdout.strip() == "reset today's (2026-12-01) quota of all sessions: 45 tokens cleared"
    )
    _, out = run(shell, "%ania quota reset nb:nobody")
    assert out.stdout.strip().endswith("quota of nb:nobody: 0 tokens cleared")

    store = state.run_sync(agent.host.open_store())
    log = state.run_sync(store.oplog.list(category="quota"))
    assert [(e.action, e.actor, e.session) for e in log] == [
        ("reset", "notebook", "nb:nobody"),
        ("reset", "notebook", None),
        ("reset", "notebook", "nb:default"),
    ]
    assert state.run_sync(store.usage.used(TODAY)) == 0
    assert sum(r.total for r in state.run_sync(store.usage.daily(TODAY, TODAY))) == 255

    for bad in ("%ania quota frob", "%ania quota reset a b"):
        result, _ = run(shell, bad)
        assert not result.success and "usage: %ania quota" in str(result.error_in_exec)
    result, _ = run(shell, "%ania quota reset ''")
    assert not result.success
    assert "session must be a non-empty string" in str(result.error_in_exec)
