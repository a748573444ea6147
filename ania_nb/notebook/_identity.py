"""Which conversation a notebook's plain ``%%agent`` cells use: one stable id per notebook.

A file name is a poor key: JupyterLab's first save renames ``Untitled.ipynb``, and the next new
``Untitled.ipynb`` would inherit the old conversation. So each notebook gets a session
``nb:<8 hex>`` the first time it talks to the agent, with a record in the store (KV namespace
``notebooks``) of what identifies it: its path, the file's inode (a rename keeps it), the ids of
the cells that ran ``%%agent`` (a rename, a git checkout and a reopen keep them) and the Jupyter
kernel that used it (a kernel restart keeps the kernel id). A kernel finds its notebook's path by
asking its Jupyter server (the path follows renames), else ``JPY_SESSION_NAME``.

Everything here that touches files or the network is blocking: call it off the event loop.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..session_keys import notebook_key

NAMESPACE = "notebooks"
MAX_CELLS = 64  # cell ids remembered per notebook: enough to recognise it, small to store


@dataclass
class Facts:
    """What the kernel can see of its notebook right now."""

    kernel_id: str | None = None
    path: str | None = None  # absolute
    inode: list[int] | None = None  # [st_dev, st_ino]
    cells: set[str] = field(default_factory=set)  # cell ids in the saved file
    cell_id: str | None = None  # the cell running now (JupyterLab sends it)


def kernel_id() -> str | None:
    """The id of this kernel (the ``kernel-<id>.json`` connection file), None outside Jupyter."""
    try:
        from ipykernel.connect import get_connection_file

        name = Path(get_connection_file()).name
    except Exception:  # not an ipykernel, or no app: plain IPython
        return None
    return name[len("kernel-") : -len(".json")] if name.startswith("kernel-") else None


def current_cell_id(shell: Any) -> str | None:
    """The id of the cell being executed, as JupyterLab sends it (``metadata.cellId``)."""
    kernel = getattr(shell, "kernel", None)
    try:
        parent = kernel.get_parent("shell") if kernel is not None else None
    except Exception:
        return None
    cell = ((parent or {}).get("metadata") or {}).get("cellId")
    return cell if isinstance(cell, str) and cell else None


def server_path(kid: str, timeout: float = 2.0) -> str | None:
    """Ask the Jupyter server that started this kernel for its notebook's current path."""
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        infos = [
            json.loads(p.read_text(encoding="utf-8"))
            for p in Path(jupyter_runtime_dir()).glob("jpserver-*.json")
        ]
    except (OSError, ValueError, ImportError):
        return None
    # The server that launched us is our parent process: ask it first.
    infos.sort(key=lambda info: info.get("pid") != os.getppid())
    for info in infos:
        url, token = str(info.get("url", "")), str(info.get("token", ""))
        if not url.startswith("http"):
            continue
        query = f"?{urllib.parse.urlencode({'token': token})}" if token else ""
        try:
            with urllib.request.urlopen(
                f"{url.rstrip('/')}/api/sessions{query}", timeout=timeout
            ) as r:
                sessions = json.loads(r.read())
        except (OSError, ValueError):
            continue
        for s in sessions if isinstance(sessions, list) else []:
            if (s.get("kernel") or {}).get("id") == kid and s.get("path"):
                return str(Path(str(info.get("root_dir", "."))).expanduser() / s["path"])
    return None


def file_facts(path: str, *, cells: bool = True) -> tuple[list[int] | None, set[str]]:
    """The file's ``[dev, inode]`` and (optionally) the cell ids saved in it."""
    try:
        st = os.stat(path)
    except OSError:
        return None, set()
    ids: set[str] = set()
    if cells:
        try:
            nb = json.loads(Path(path).read_text(encoding="utf-8"))
            ids = {c["id"] for c in nb.get("cells", []) if isinstance(c.get("id"), str)}
        except (OSError, ValueError, AttributeError, TypeError):
            pass
    return [st.st_dev, st.st_ino], ids


def gather(shell: Any, *, cells: bool = True) -> Facts:
    """What identifies this kernel's notebook now (blocking: a file read and a local HTTP call)."""
    kid = kernel_id()
    # Only a kernel a Jupyter server started for a notebook has this; others (nbclient,
    # papermill, a console) have no notebook to follow and no server to ask.
    path = os.environ.get("JPY_SESSION_NAME") or None
    if path and kid:
        path = server_path(kid) or path
    facts = Facts(kernel_id=kid, path=path, cell_id=current_cell_id(shell))
    if path:
        facts.inode, facts.cells = file_facts(path, cells=cells)
    return facts


def same_notebook(record: dict[str, Any], inode: list[int] | None, cells: set[str]) -> bool:
    """Whether a file with this inode and these cell ids is the recorded notebook."""
    known = set(record.get("cells") or ())
    if known and cells:
        return bool(known & cells)  # cell ids survive renames, copies back, git checkouts
    return inode is not None and record.get("inode") == inode


def choose(records: dict[str, dict[str, Any]], facts: Facts) -> str | None:
    """The session of the recorded notebook these facts describe, None for a new notebook."""
    if facts.kernel_id:
        for session, rec in records.items():
            if rec.get("kernel") == facts.kernel_id:
                return session  # this kernel (or its restart) already talked for it
    here = [s for s, r in records.items() if same_notebook(r, facts.inode, facts.cells)]
    for session in here:
        if records[session].get("path") == facts.path:
            return session
    for session in sorted(here, key=lambda s: -float(records[s].get("used", 0))):
        old = records[session].get("path")
        if not old:
            return session
        # Moved or copied? A copy leaves the original in place: then this is a new notebook.
        inode, cells = file_facts(old)
        if not same_notebook(records[session], inode, cells):
            return session
    return None


def update(record: dict[str, Any], facts: Facts) -> dict[str, Any]:
    """The record after a run in this notebook: path, inode, kernel, the running cell."""
    # The cells saved in the file and the one running now: a reopened notebook is recognised
    # by any of them, even if the %%agent cell itself was never saved.
    fresh = sorted(facts.cells) + ([facts.cell_id] if facts.cell_id else [])
    cells = [c for c in record.get("cells") or () if c not in fresh] + fresh
    return {
        **record,
        "path": facts.path,
        "inode": facts.inode if facts.inode is not None else record.get("inode"),
        "kernel": facts.kernel_id,
        "cells": cells[-MAX_CELLS:],
        "used": time.time(),
    }


def new_session() -> str:
    """A fresh notebook session name."""
    return notebook_key(secrets.token_hex(4))
