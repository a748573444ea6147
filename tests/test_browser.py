"""The quickstart in a real JupyterLab, driven by Debian's Chromium through Playwright.

A JupyterLab server runs on 127.0.0.1 (random free port, random token) in a temporary copy of
the quickstart; Chromium opens it, runs the cells up to the agent cell, answers the approval card
and reads what the widget (and the scripted model's recorded request) show. Screenshots go to
``test-artifacts/``; with ``UPDATE_DOCS_SCREENSHOT=1`` the approval screenshot is also copied to
``docs/run-widget.png`` for the README.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "notebooks" / "quickstart.ipynb"
ARTIFACTS = ROOT / "test-artifacts"
DOCS_SCREENSHOT = ROOT / "docs" / "run-widget.png"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHORT_TIMEOUT = re.compile(r"\bapproval\.timeout=10\b")
WAIT_MS = 90_000  # generous: a cold kernel on a busy 2-core CI machine
# Lab settings: no news or update checks (no network), every cell in the DOM.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's Chromium is not installed at /usr/bin/chromium (apt-get install chromium)",
)


@dataclass
class Lab:
    """A running JupyterLab server: its address, token and notebook folder."""

    url: str
    token: str
    root: Path

    def notebook(self, name: str) -> str:
        """Copy the quickstart into the server's folder as ``name``; return its URL in the lab.

        The copy waits up to 120 s for an answer: the 10 s of the shipped notebook (so that
        unattended runs finish) is too short to be safe on a slow machine.
        """
        notebook = json.loads(QUICKSTART.read_text(encoding="utf-8"))
        changed = 0
        for cell in notebook["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and source.startswith("%ania config"):
                cell["source"], n = SHORT_TIMEOUT.subn("approval.timeout=120", source)
                changed += n
        assert changed == 1, "the quickstart no longer sets approval.timeout=10"
        (self.root / name).write_text(json.dumps(notebook), encoding="utf-8")
        # A workspace of its own, so the lab does not reopen other tests' notebooks.
        workspace = Path(name).stem
        return f"{self.url}/lab/workspaces/{workspace}/tree/{name}?token={self.token}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(url: str, method: str = "GET") -> int:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=5) as response:
        return int(response.status)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Start ``jupyter lab`` as a subprocess in a temporary folder; shut it down afterwards."""
    base = tmp_path_factory.mktemp("lab")
    root, settings = base / "notebooks", base / "settings"
    root.mkdir()
    for name, values in LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANIA_", "JUPYTER"))}
    env.update(
        JUPYTER_CONFIG_DIR=str(base / "config"),
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        PYTHONUNBUFFERED="1",
    )
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={base / 'workspaces'}",
        "--LabApp.news_url=",
        "--LabApp.extension_manager=readonly",  # no PyPI look-ups
    ]
    if os.geteuid() == 0:  # CI containers run as root
        command.append("--allow-root")
    log_path = base / "jupyter.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                if _request(f"{url}/api/status?token={token}") == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"jupyter lab did not answer within 90 s:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield Lab(url, token, root)
    finally:
        _stop(proc, f"{url}/api/shutdown?token={token}")
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(log_path, ARTIFACTS / "jupyter-lab.log")


def _stop(proc: subprocess.Popen[bytes], shutdown_url: str) -> None:
    """Shut the server down through its API (it stops its kernels), else signal it."""
    if proc.poll() is None:
        try:
            _request(shutdown_url, method="POST")
            proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def page(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A page of a fresh headless Chromium (Debian's build, never a downloaded one).

    A failing test leaves a full-page screenshot in ``test-artifacts/``.
    """
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=WAIT_MS)

    failure_shot = ARTIFACTS / f"failed-{request.node.name}.png"
    failure_shot.unlink(missing_ok=True)
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1100, "height": 1600},
            device_scale_factor=2,  # crisp screenshots for the README
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(WAIT_MS)
            failed_before = request.session.testsfailed
            yield page
            if request.session.testsfailed > failed_before:
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(failure_shot))
        finally:
            context.close()


def _cell_index(source_start: str) -> int:
    cells = json.loads(QUICKSTART.read_text(encoding="utf-8"))["cells"]
    for i, cell in enumerate(cells):
        if "".join(cell["source"]).startswith(source_start):
            return i
    raise AssertionError(f"no quickstart cell starts with {source_start!r}")


ACTIVE = re.compile(r"\bjp-mod-active\b")
AGENT_CELL = _cell_index("%%agent\nHow many units")
MODEL_SAW_CELL = _cell_index("request = llm.requests[-1]")


class Notebook:
    """The quickstart open in JupyterLab: run cells with Shift+Enter, look at their output."""

    def __init__(self, page: Any, url: str) -> None:
        from playwright.sync_api import expect

        self.page = page
        self.expect = expect
        self.next = 0  # the first cell not run yet
        page.goto(url)
        self.cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")
        self.expect(self.cells.nth(AGENT_CELL)).to_be_visible()
        browser_tab = page.get_by_role("tab", name=re.compile("File Browser"))
        if browser_tab.get_attribute("aria-selected") == "true":
            browser_tab.click()  # fold the file browser away: more room for the widget
        # The kernel is connected (the toolbar's indicator says "idle" before it even starts).
        status_bar = page.locator("#jp-main-statusbar")
        self.expect(status_bar).to_contain_text(re.compile(r"Python[^|]*\| Idle"))

    def select(self, index: int) -> None:
        """Make cell ``index`` the active cell, in command mode."""
        self.cells.nth(index).locator(".jp-InputPrompt").click()
        self.page.keyboard.press("Escape")
        self.expect(self.cells.nth(index)).to_have_class(ACTIVE)

    def run_through(self, index: int) -> None:
        """Shift+Enter from the first cell not run yet through cell ``index``."""
        self.select(self.next)  # a click in a widget may have moved the selection
        while self.next <= index:
            self.page.keyboard.press("Shift+Enter")
            self.next += 1
            self.expect(self.cells.nth(self.next)).to_have_class(ACTIVE)

    def output(self, index: int) -> Any:
        """The output area of cell ``index``."""
        return self.cells.nth(index).locator(".jp-OutputArea")

    def button(self, index: int, label: str) -> Any:
        """A widget button of cell ``index`` with exactly this label."""
        pattern = re.compile(rf"^\s*{re.escape(label)}\s*$")
        return self.output(index).locator("button", has_text=pattern)


def _open_at_approval(lab: Lab, page: Any, name: str) -> Notebook:
    notebook = Notebook(page, lab.notebook(name))
    notebook.run_through(AGENT_CELL)
    allow = notebook.button(AGENT_CELL, "Allow")
    notebook.expect(allow).to_be_enabled()
    notebook.expect(notebook.output(AGENT_CELL).get_by_text("Approval needed")).to_be_visible()
    return notebook


def _screenshot(notebook: Notebook, index: int, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    notebook.cells.nth(index).screenshot(path=str(path))
    return path


def test_allow_runs_the_tool_and_the_widget_shows_its_result(lab: Lab, page: Any):
    notebook = _open_at_approval(lab, page, "allow.ipynb")
    _screenshot(notebook, AGENT_CELL, "approval-pending.png")

    notebook.button(AGENT_CELL, "Allow").click()

    output = notebook.output(AGENT_CELL)
    # The python tool's result, in its row and in the reply the model built from it.
    row = output.get_by_text(re.compile(r"python\(.*→ \{'north': 380, 'south': 313\}"))
    notebook.expect(row.first).to_be_visible()
    reply = output.get_by_text("Units sold per region: {'north': 380, 'south': 313}")
    notebook.expect(reply).to_be_visible()
    notebook.expect(output.get_by_text("allowed — approved by the user")).to_be_visible()
    notebook.expect(notebook.button(AGENT_CELL, "Deny")).to_be_disabled()
    shot = _screenshot(notebook, AGENT_CELL, "approval-allowed.png")
    if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1":
        DOCS_SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copy(shot, DOCS_SCREENSHOT)


def test_deny_reaches_the_model_as_the_tool_result(lab: Lab, page: Any):
    notebook = _open_at_approval(lab, page, "deny.ipynb")

    notebook.button(AGENT_CELL, "Deny").click()

    output = notebook.output(AGENT_CELL)
    notebook.expect(output.get_by_text("denied — denied by the user")).to_be_visible()
    notebook.expect(output.get_by_text("I could not compute the totals")).to_be_visible()
    # "What the model saw": the request recorded by the scripted server after the denial.
    notebook.run_through(MODEL_SAW_CELL)
    saw = notebook.output(MODEL_SAW_CELL)
    notebook.expect(saw).to_contain_text("[python]")
    notebook.expect(saw).to_contain_text("Tool call not approved: denied by the user")
    _screenshot(notebook, MODEL_SAW_CELL, "model-saw-denial.png")
