"""Reading kb documents from real files (md, txt, ipynb, PDFs made here) and table columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pypdf import PdfReader, PdfWriter

from ania_nb.knowledge.ingest import (
    MAX_TEXT_BYTES,
    SUPPORTED_SUFFIXES,
    dataframe_documents,
    expand_paths,
    read_document,
)
from ania_nb.knowledge.model import KnowledgeError, SourceDoc


def _pdf_bytes(*pages: str) -> bytes:
    """A minimal valid PDF with one Helvetica text line per page (xref offsets computed)."""
    count = len(pages)
    page_ids = [4 + 2 * i for i in range(count)]
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{' '.join(f'{p} 0 R' for p in page_ids)}] /Count {count} >>",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, text in enumerate(pages):
        stream = f"BT /F1 18 Tf 72 700 Td ({text}) Tj ET"
        objects.append(
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {page_ids[i] + 1} 0 R >>"
        )
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    out += (
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    return bytes(out)


def _write_pdf(path: Path, *pages: str, title: str | None = None, password: str = "") -> Path:
    path.write_bytes(_pdf_bytes(*pages))
    if title is not None or password:
        writer = PdfWriter(clone_from=PdfReader(path))
        if title is not None:
            writer.add_metadata({"/Title": title})
        if password:
            writer.encrypt(user_password=password, owner_password=password + "-owner")
        with path.open("wb") as f:
            writer.write(f)
    return path


def _notebook(path: Path, cells: list[dict[str, object]]) -> Path:
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- expand_paths


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "docs" / "deep" / "deeper").mkdir(parents=True)
    (tmp_path / "docs" / ".ipynb_checkpoints").mkdir()
    for rel in [
        "a.md",
        "b.txt",
        "docs/c.MARKDOWN",
        "docs/notes.ipynb",
        "docs/deep/d.md",
        "docs/deep/deeper/e.pdf",
        "docs/deep/skip.docx",
        "docs/.ipynb_checkpoints/notes-checkpoint.ipynb",
        "docs/.hidden.md",
    ]:
        (tmp_path / rel).write_text("x", encoding="utf-8")
    return tmp_path


def test_folders_are_walked_recursively_for_supported_files(tree: Path) -> None:
    found = expand_paths(tree / "docs")
    assert [p.relative_to(tree).as_posix() for p in found] == [
        "docs/c.MARKDOWN",
        "docs/deep/d.md",
        "docs/deep/deeper/e.pdf",
        "docs/notes.ipynb",
    ]


def test_globs_with_double_star_relative_to_base_sorted_and_deduped(tree: Path) -> None:
    found = expand_paths(["**/*.md", "a.md", tree / "a.md", "docs/deep/../../a.md"], base=tree)
    assert [p.relative_to(tree).as_posix() for p in found] == ["a.md", "docs/deep/d.md"]
    assert all(p.is_absolute() for p in found)
    assert expand_paths("*.txt", base=tree) == [tree / "b.txt"]
    # a glob matching a folder takes the folder's files
    assert [p.name for p in expand_paths("docs/dee?", base=tree)] == ["d.md", "e.pdf"]


def test_relative_specs_without_base_use_the_working_directory(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tree)
    assert expand_paths("b.txt") == [Path("b.txt")]
    assert expand_paths(["*.md", "b.txt"]) == [Path("a.md"), Path("b.txt")]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("missing.md", "no such file or folder: 'missing.md'"),
        ("**/*.rst", r"files match '\*\*/\*.rst'"),
        ("docs/deep/skip.docx", r"\.docx files are not supported"),
        ("   ", "blank path"),
    ],
)
def test_a_spec_that_matches_nothing_names_it(tree: Path, spec: str, message: str) -> None:
    with pytest.raises(KnowledgeError, match=message):
        expand_paths(["a.md", spec], base=tree)


def test_an_empty_folder_and_an_empty_list_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "x.docx").write_text("x")
    with pytest.raises(KnowledgeError, match=r"no .* files in folder 'empty'"):
        expand_paths("empty", base=tmp_path)
    with pytest.raises(KnowledgeError, match="no files given"):
        expand_paths([])


def test_supported_suffixes() -> None:
    assert set(SUPPORTED_SUFFIXES) == {".md", ".markdown", ".txt", ".pdf", ".ipynb"}


# ---------------------------------------------------------------------------- text files


def test_markdown_title_is_the_first_h1_outside_code(tmp_path: Path) -> None:
    path = tmp_path / "guide.md"
    path.write_text(
        "Intro line\n## Not this\n```\n# not a heading, code\n```\n# Real Title ##\n\nBody.\n",
        encoding="utf-8",
    )
    doc = read_document(path)
    assert doc == SourceDoc("Real Title", doc.content, str(path))
    assert doc.content.startswith("Intro line") and doc.content.endswith("Body.")


def test_markdown_without_h1_and_text_files_take_the_stem(tmp_path: Path) -> None:
    md = tmp_path / "没有标题.markdown"
    md.write_text("## only level two\n\n内容", encoding="utf-8")
    assert read_document(md).title == "没有标题"
    txt = tmp_path / "plain.txt"
    txt.write_bytes("\ufeff# looks like a heading\r\nline two\r\n".encode())
    doc = read_document(txt)
    assert doc.title == "plain"  # .txt is not markdown
    assert doc.content == "# looks like a heading\nline two"  # BOM gone, CRLF normalised


def test_utf16_text_with_bom_is_read(tmp_path: Path) -> None:
    path = tmp_path / "wide.txt"
    path.write_bytes("宽字符 text".encode("utf-16"))
    assert read_document(path).content == "宽字符 text"


def test_undecodable_binary_empty_and_missing_files_are_refused(tmp_path: Path) -> None:
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    with pytest.raises(KnowledgeError, match=r"not UTF-8 text \(byte 0xe9 at offset 3\)"):
        read_document(latin)
    binary = tmp_path / "bin.md"
    binary.write_bytes(b"abc\x00def")
    with pytest.raises(KnowledgeError, match="looks binary"):
        read_document(binary)
    blank = tmp_path / "blank.md"
    blank.write_text(" \n\n\t", encoding="utf-8")
    with pytest.raises(KnowledgeError, match=r"blank\.md' has no text"):
        read_document(blank)
    with pytest.raises(KnowledgeError, match=r"cannot read .*gone\.md"):
        read_document(tmp_path / "gone.md")
    with pytest.raises(KnowledgeError, match=r"use a \.md"):
        read_document(tmp_path / "x.docx")


def test_more_than_5_mb_of_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_bytes(b"a" * (MAX_TEXT_BYTES + 1))
    with pytest.raises(KnowledgeError, match="more than 5 MB of text"):
        read_document(path)
    path.write_bytes(b"a" * MAX_TEXT_BYTES)
    assert len(read_document(path).content) == MAX_TEXT_BYTES


# ---------------------------------------------------------------------------- notebooks


def test_notebook_markdown_and_code_joined_outputs_and_raw_skipped(tmp_path: Path) -> None:
    path = _notebook(
        tmp_path / "analysis.ipynb",
        [
            {"cell_type": "markdown", "metadata": {}, "source": ["Some intro\n", "## Analysis"]},
            {
                "cell_type": "code",
                "metadata": {},
                "execution_count": 1,
                "source": "import math\nprint(math.pi)",
                "outputs": [{"output_type": "stream", "name": "stdout", "text": ["SECRET-OUT"]}],
            },
            {"cell_type": "raw", "metadata": {}, "source": "RAW-CELL"},
            {"cell_type": "code", "metadata": {}, "source": [], "outputs": []},
            {"cell_type": "markdown", "metadata": {}, "source": "# Later H1"},
        ],
    )
    doc = read_document(path)
    assert doc.title == "Analysis"  # the notebook's first heading, of any level
    assert doc.content == "Some intro\n## Analysis\n\nimport math\nprint(math.pi)\n\n# Later H1"
    assert doc.source == str(path)


def test_notebook_without_heading_takes_the_stem_and_bad_json_is_refused(tmp_path: Path) -> None:
    path = _notebook(tmp_path / "nb.ipynb", [{"cell_type": "code", "source": "x = 1"}])
    assert read_document(path) == SourceDoc("nb", "x = 1", str(path))
    broken = tmp_path / "broken.ipynb"
    broken.write_text('{"cells": [', encoding="utf-8")
    with pytest.raises(KnowledgeError, match=r"not a notebook \(bad JSON"):
        read_document(broken)
    listy = tmp_path / "listy.ipynb"
    listy.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(KnowledgeError, match="not a notebook"):
        read_document(listy)


def test_nbformat3_worksheets_are_read(tmp_path: Path) -> None:
    path = tmp_path / "old.ipynb"
    nb = {
        "nbformat": 3,
        "worksheets": [{"cells": [{"cell_type": "code", "input": ["a = 1\n", "b = 2"]}]}],
    }
    path.write_text(json.dumps(nb), encoding="utf-8")
    assert read_document(path).content == "a = 1\nb = 2"


# ---------------------------------------------------------------------------- PDFs


def test_pdf_text_of_all_pages_with_metadata_title(tmp_path: Path) -> None:
    path = _write_pdf(tmp_path / "report.pdf", "First page text", "Second page", title="Q3 Report")
    doc = read_document(path)
    assert doc.title == "Q3 Report"
    assert "First page text" in doc.content and "Second page" in doc.content
    assert doc.content.index("First") < doc.content.index("Second")


def test_pdf_without_title_takes_the_stem(tmp_path: Path) -> None:
    doc = read_document(_write_pdf(tmp_path / "manual.pdf", "Hello PDF"))
    assert (doc.title, doc.content) == ("manual", "Hello PDF")


def test_encrypted_broken_and_textless_pdfs_are_refused(tmp_path: Path) -> None:
    locked = _write_pdf(tmp_path / "locked.pdf", "secret", password="pw")
    with pytest.raises(KnowledgeError, match=r"locked\.pdf' is an encrypted PDF"):
        read_document(locked)
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\nthis is not really a pdf")
    with pytest.raises(KnowledgeError, match=r"cannot read PDF .*broken\.pdf"):
        read_document(broken)
    scan = _write_pdf(tmp_path / "scan.pdf", "")
    with pytest.raises(KnowledgeError, match="no text layer"):
        read_document(scan)


def test_pdf_encrypted_with_an_empty_user_password_is_read(tmp_path: Path) -> None:
    path = tmp_path / "owner-only.pdf"
    path.write_bytes(_pdf_bytes("Readable anyway"))
    writer = PdfWriter(clone_from=PdfReader(path))
    writer.encrypt(user_password="", owner_password="owner")
    with path.open("wb") as f:
        writer.write(f)
    assert read_document(path).content == "Readable anyway"


# ---------------------------------------------------------------------------- tables


class _Column(list[object]):
    """A column like pandas' Series: ``tolist()`` gives plain values."""

    def tolist(self) -> list[object]:
        return list(self)


class _Frame:
    """A duck-typed table (pandas is not a dependency): ``frame[name]`` and ``columns``."""

    def __init__(self, **columns: list[object]) -> None:
        self._data = {k: _Column(v) for k, v in columns.items()}
        self.columns = list(columns)

    def __getitem__(self, name: str) -> _Column:
        return self._data[name]


def test_dataframe_rows_become_documents_skipping_blank_cells() -> None:
    frame = _Frame(
        text=["First answer", None, "  ", float("nan"), "Second\r\nanswer", 42],
        name=["Intro", "x", "y", "z", None, "Number"],
    )
    docs = dataframe_documents(frame, "text", title_column="name", source="faq.csv")
    assert docs == [
        SourceDoc("Intro", "First answer", "faq.csv"),
        SourceDoc("text row 4", "Second\nanswer", "faq.csv"),
        SourceDoc("Number", "42", "faq.csv"),
    ]
    plain = dataframe_documents({"q": ["a", "b"]}, "q")  # a dict of lists works too
    assert plain == [SourceDoc("q row 0", "a", "dataframe"), SourceDoc("q row 1", "b", "dataframe")]


def test_dataframe_unknown_column_names_the_known_ones() -> None:
    frame = _Frame(text=["a"], name=["b"])
    with pytest.raises(KnowledgeError, match=r"no column 'body' \(columns: text, name\)"):
        dataframe_documents(frame, "body")
    with pytest.raises(KnowledgeError, match="no column 'title'"):
        dataframe_documents(frame, "text", title_column="title")
    with pytest.raises(KnowledgeError, match="differ in length"):
        dataframe_documents({"a": ["x", "y"], "b": ["t"]}, "a", title_column="b")
    with pytest.raises(KnowledgeError, match="not a sequence"):
        dataframe_documents({"a": "text"}, "a")
