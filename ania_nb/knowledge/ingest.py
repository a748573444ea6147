"""Reading documents for the knowledge base: files, folders and globs, and DataFrame columns.

Everything here is synchronous and may block on the disk: callers run it off the event loop.
PDF support (pypdf) is imported only when a PDF is read.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .chunking import normalize_newlines
from .model import KnowledgeError, SourceDoc

__all__ = [
    "MAX_TEXT_BYTES",
    "SUPPORTED_SUFFIXES",
    "dataframe_documents",
    "expand_paths",
    "read_document",
]

SUPPORTED_SUFFIXES = (".md", ".markdown", ".txt", ".pdf", ".ipynb")
MAX_TEXT_BYTES = 5 * 1024 * 1024  # of text, whatever the file's own size
# A notebook's file is mostly outputs (skipped); past this it is not worth parsing.
_MAX_NOTEBOOK_BYTES = 20 * MAX_TEXT_BYTES

_MAGIC = re.compile(r"[*?\[]")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_H1 = re.compile(r"^\s{0,3}#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_HEADING = re.compile(r"^\s{0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_SUPPORTED = ", ".join(SUPPORTED_SUFFIXES)


# ---------------------------------------------------------------------------- finding files


def expand_paths(spec: str | Path | Iterable[str | Path], base: Path | None = None) -> list[Path]:
    """The supported files that paths, folders (recursively) and globs (``**`` too) name."""
    specs = [spec] if isinstance(spec, str | Path) else list(spec)
    if not specs:
        raise KnowledgeError("no files given: pass a path, a folder or a glob")
    found: dict[Path, Path] = {}  # resolved -> as found
    for item in specs:
        paths = _expand_one(str(item), base)
        for path in paths:
            found.setdefault(path.resolve(), path)
    return sorted(found.values(), key=lambda p: str(p))


def _expand_one(item: str, base: Path | None) -> list[Path]:
    if not item.strip():
        raise KnowledgeError("a blank path was given")
    path = Path(os.path.expanduser(item))
    if base is not None and not path.is_absolute():
        path = base / path
    if _MAGIC.search(item):
        matches = [Path(m) for m in glob.glob(str(path), recursive=True)]
        files = [f for m in matches for f in (_folder_files(m) if m.is_dir() else [m])]
        files = [f for f in files if f.is_file() and _supported(f)]
        if not files:
            raise KnowledgeError(f"no {_SUPPORTED} files match {item!r}")
        return files
    if path.is_dir():
        files = _folder_files(path)
        if not files:
            raise KnowledgeError(f"no {_SUPPORTED} files in folder {item!r}")
        return files
    if path.is_file():
        if not _supported(path):
            raise KnowledgeError(
                f"cannot read {item!r}: {path.suffix or 'no suffix'} files are not supported "
                f"(use {_SUPPORTED})"
            )
        return [path]
    raise KnowledgeError(f"no such file or folder: {item!r}")


def _folder_files(folder: Path) -> list[Path]:
    # Hidden entries (.git, .ipynb_checkpoints, .venv) hold copies and tooling, not documents.
    files: list[Path] = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        files.extend(Path(root, n) for n in names if not n.startswith("."))
    return [f for f in files if _supported(f) and f.is_file()]


def _supported(path: Path) -> bool:
    return path.suffix.lower() in SUPPORTED_SUFFIXES


# ---------------------------------------------------------------------------- reading files


def read_document(path: Path) -> SourceDoc:
    """Read one .md/.markdown/.txt/.pdf/.ipynb file into a document (title, text, source)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise KnowledgeError(f"cannot read {str(path)!r}: use a {_SUPPORTED} file")
    try:
        if suffix == ".pdf":
            title, content = _read_pdf(path)
        elif suffix == ".ipynb":
            title, content = _read_notebook(path)
        else:
            text = _read_text(path, MAX_TEXT_BYTES)
            title = _markdown_title(text) if suffix in (".md", ".markdown") else ""
            content = text
    except OSError as exc:
        raise KnowledgeError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from exc
    content = normalize_newlines(content).strip()
    if not content:
        raise KnowledgeError(f"{str(path)!r} has no text to add")
    if len(content.encode("utf-8")) > MAX_TEXT_BYTES:
        raise KnowledgeError(_too_big(path))
    return SourceDoc(title.strip() or path.stem, content, str(path))


def _too_big(path: Path) -> str:
    mb = MAX_TEXT_BYTES // (1024 * 1024)
    return f"{str(path)!r} has more than {mb} MB of text: split it into smaller files"


def _read_text(path: Path, limit: int) -> str:
    if path.stat().st_size > limit:
        raise KnowledgeError(_too_big(path))
    data = path.read_bytes()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16"
    else:
        encoding = "utf-8-sig"
        if b"\x00" in data:
            raise KnowledgeError(f"{str(path)!r} looks binary (it has NUL bytes), not text")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise KnowledgeError(
            f"{str(path)!r} is not {encoding.removesuffix('-sig').upper()} text "
            f"(byte {exc.object[exc.start]:#04x} at offset {exc.start}): save it as UTF-8"
        ) from exc


def _markdown_title(text: str) -> str:
    """The first level-1 ``# `` heading outside code fences, or ""."""
    return _first_heading(text, _H1)


def _first_heading(text: str, pattern: re.Pattern[str]) -> str:
    fenced = False
    for line in normalize_newlines(text).split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := pattern.match(line)):
            return m.group(1).strip()
    return ""


def _read_notebook(path: Path) -> tuple[str, str]:
    text = _read_text(path, _MAX_NOTEBOOK_BYTES)
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KnowledgeError(f"{str(path)!r} is not a notebook (bad JSON: {exc})") from exc
    if not isinstance(nb, dict):
        raise KnowledgeError(f"{str(path)!r} is not a notebook (no cells)")
    cells = nb.get("cells")
    if cells is None:  # nbformat 3: cells live in worksheets, code in "input"
        cells = [c for ws in nb.get("worksheets") or [] for c in ws.get("cells") or []]
    if not isinstance(cells, list):
        raise KnowledgeError(f"{str(path)!r} is not a notebook (no cells)")
    parts: list[str] = []
    title = ""
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("markdown", "code"):
            continue  # raw cells and junk; outputs are never read
        source = cell.get("source", cell.get("input", ""))
        body = "".join(source) if isinstance(source, list) else str(source or "")
        if not body.strip():
            continue
        if cell["cell_type"] == "markdown" and not title:
            title = _first_heading(body, _HEADING)
        parts.append(body.strip("\n"))
    return title, "\n\n".join(parts)


def _read_pdf(path: Path) -> tuple[str, str]:
    try:
        from pypdf import PdfReader
    except ImportError as exc:  # pragma: no cover - pypdf is a dependency
        raise KnowledgeError("reading PDFs needs pypdf: pip install pypdf") from exc
    name = str(path)
    try:
        reader = PdfReader(path)
        if reader.is_encrypted and not reader.decrypt(""):
            raise KnowledgeError(f"{name!r} is an encrypted PDF: decrypt it first")
        meta = reader.metadata
        title = str(meta.title or "") if meta is not None else ""
        pages: list[str] = []
        size = 0
        for page in reader.pages:
            text = page.extract_text() or ""
            size += len(text)
            if size > MAX_TEXT_BYTES:
                raise KnowledgeError(_too_big(path))
            pages.append(text.strip())
    except KnowledgeError:
        raise
    except OSError:
        raise
    except Exception as exc:  # pypdf raises many types for damaged files
        raise KnowledgeError(f"cannot read PDF {name!r}: {type(exc).__name__}: {exc}") from exc
    content = "\n\n".join(p for p in pages if p)
    if not content.strip():
        raise KnowledgeError(f"{name!r} has no text layer (a scan?): nothing to add")
    return title, content


# ---------------------------------------------------------------------------- DataFrames


def dataframe_documents(
    df: Any, column: str, *, title_column: str | None = None, source: str = "dataframe"
) -> list[SourceDoc]:
    """One document per non-blank cell of ``df[column]`` (a pandas DataFrame or alike)."""
    values = _column(df, column)
    titles = _column(df, title_column) if title_column is not None else [None] * len(values)
    if len(titles) != len(values):
        raise KnowledgeError(f"columns {column!r} and {title_column!r} differ in length")
    docs = []
    for i, (cell, title) in enumerate(zip(values, titles, strict=True)):
        text = _cell_text(cell)
        if not text:
            continue
        docs.append(SourceDoc(_cell_text(title) or f"{column} row {i}", text, source))
    return docs


def _column(df: Any, column: str) -> list[Any]:
    try:
        values = df[column]
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        columns = getattr(df, "columns", None)
        if columns is None and isinstance(df, dict):
            columns = list(df)
        known = f" (columns: {', '.join(map(str, columns))})" if columns is not None else ""
        raise KnowledgeError(f"no column {column!r}{known}") from exc
    for method in ("tolist", "to_pylist"):  # pandas/numpy, pyarrow
        if callable(getattr(values, method, None)):
            return list(getattr(values, method)())
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise KnowledgeError(f"column {column!r} is not a sequence of values")
    return list(values)


def _cell_text(cell: Any) -> str:
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return ""  # missing values: None, NaN (pandas' NA types stringify as <NA>/NaT)
    if type(cell).__name__ in ("NAType", "NaTType"):
        return ""
    return normalize_newlines(str(cell)).strip()
