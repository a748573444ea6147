"""``%ania kb`` and ``%ania memory``: the knowledge panel and memory list, or one command.

``%ania kb [SCOPE]`` shows a `KbPanel` (default scope: this notebook's session);
``%ania kb add PATH|GLOB … [--scope S]`` adds files with a progress bar; ``%ania kb add-df
VAR COLUMN [--title COL]`` adds one document per cell of a DataFrame (or pyarrow table, or
dict of lists) column; ``%ania kb search QUERY [--scope S]`` prints ranked results (the scope
and ``global``); ``%ania kb delete ID [--scope S]`` deletes a document.
``%ania memory [SCOPE]`` shows a `MemoryList`; ``%ania memory forget ID [--scope S]`` forgets
one memory.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from IPython.core.error import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Awaitable

    from ..knowledge import AddResult, Knowledge
    from .extension import NotebookState

KB_USAGE = (
    "usage: %ania kb [SCOPE] (the panel) | kb add PATH|GLOB … [--scope S] | "
    "kb add-df VAR COLUMN [--title COL] [--scope S] | kb search QUERY [--scope S] | "
    "kb delete ID [--scope S]"
)
MEMORY_USAGE = "usage: %ania memory [SCOPE] (the list) | memory forget ID [--scope S]"
_SCOPE_OPTION = re.compile(r"(?:^|\s)--scope(?:=|\s+)(\S+)")


async def kb_command(state: NotebookState, line: str) -> None:
    """Run ``%ania kb <line>``; the search query is taken verbatim (quotes stay as typed)."""
    from .magics import split_words

    line, scope = _scope_option(line, state.default_session)
    sub, _, rest = line.partition(" ")
    rest = rest.strip()
    knowledge = await _knowledge(state)
    if sub in ("-h", "--help", "help"):
        raise UsageError(KB_USAGE)
    if sub == "search":
        if not rest:
            raise UsageError("usage: %ania kb search QUERY [--scope S]")
        await _search(knowledge, scope, rest)
    elif sub == "add":
        paths = split_words(rest)
        if not paths:
            raise UsageError("usage: %ania kb add PATH|GLOB … [--scope S]")
        await _add(knowledge, scope, paths)
    elif sub == "add-df":
        await _add_dataframe(state, knowledge, scope, split_words(rest))
    elif sub == "delete":
        ids = split_words(rest)
        if len(ids) != 1:
            raise UsageError("usage: %ania kb delete ID [--scope S]")
        if not await knowledge.kb.delete(scope, ids[0]):
            raise UsageError(f"no document {ids[0]!r} in {scope} (see %ania kb {scope})")
        print(f"deleted document {ids[0]} from {scope}")
    elif " " in line:
        raise UsageError(f"unknown %ania kb command {sub!r}\n{KB_USAGE}")
    else:  # %ania kb [SCOPE]
        from IPython.display import display

        from .widgets.knowledge import KbPanel

        panel = KbPanel(knowledge, sub or scope)
        await panel.refresh()
        display(panel)


async def memory_command(state: NotebookState, line: str) -> None:
    """Run ``%ania memory <line>``: the list of a scope, or forget one memory."""
    from .magics import split_words

    line, scope = _scope_option(line, state.default_session)
    words = split_words(line)
    knowledge = await _knowledge(state)
    if words and words[0] in ("-h", "--help", "help"):
        raise UsageError(MEMORY_USAGE)
    if words and words[0] == "forget":
        if len(words) != 2:
            raise UsageError("usage: %ania memory forget ID [--scope S]")
        if not await knowledge.memory.forget(scope, words[1]):
            raise UsageError(f"no memory {words[1]!r} in {scope} (see %ania memory {scope})")
        print(f"forgot memory {words[1]} of {scope}")
        return
    if len(words) > 1:
        raise UsageError(MEMORY_USAGE)
    from IPython.display import display

    from .widgets.knowledge import MemoryList

    view = MemoryList(knowledge, words[0] if words else scope)
    await view.refresh()
    display(view)


def _scope_option(line: str, default: str) -> tuple[str, str]:
    """The line without its ``--scope S`` option, and the scope (default: the session's)."""
    found = _SCOPE_OPTION.findall(line)
    if len(found) > 1:
        raise UsageError("--scope given more than once")
    return _SCOPE_OPTION.sub(" ", line).strip(), found[0] if found else default


async def _knowledge(state: NotebookState) -> Knowledge:
    agent = state.agent()
    knowledge = getattr(agent, "knowledge", None)
    if knowledge is None:
        raise UsageError("this agent has no knowledge base")
    return knowledge  # type: ignore[no-any-return]


async def _search(knowledge: Knowledge, scope: str, query: str) -> None:
    from ..session_keys import read_scopes
    from .widgets.knowledge import hit_line

    scopes = read_scopes(scope)
    hits = await knowledge.kb.search(query, scopes)
    if not hits:
        print(f"nothing found in {' + '.join(scopes)} for {query!r}")
    for rank, hit in enumerate(hits, 1):
        print(hit_line(rank, hit))


async def _add(knowledge: Knowledge, scope: str, paths: list[str]) -> None:
    from IPython.display import display

    from .widgets.ingest import IngestBar, ingest_with_bar

    bar = IngestBar()
    display(bar)  # ends with the summary: "added 3 document(s) (12 chunks), 1 already there"
    spec = paths[0] if len(paths) == 1 else paths
    job = ingest_with_bar(knowledge, scope, spec, bar, show_failure=False)
    _print_added(await _said_once(job))


async def _add_dataframe(
    state: NotebookState, knowledge: Knowledge, scope: str, words: list[str]
) -> None:
    from IPython.display import display

    from .widgets.ingest import IngestBar, dataframe_with_bar

    title_column = None
    if "--title" in words:
        at = words.index("--title")
        if at + 1 >= len(words):
            raise UsageError("--title needs a column name")
        title_column = words[at + 1]
        del words[at : at + 2]
    if len(words) != 2:
        raise UsageError("usage: %ania kb add-df VAR COLUMN [--title COL] [--scope S]")
    name, column = words
    if name not in state.shell.user_ns:
        raise UsageError(f"no variable {name!r} in the notebook")
    bar = IngestBar()
    display(bar)
    df = state.shell.user_ns[name]
    job = dataframe_with_bar(
        knowledge, scope, df, column, bar, title_column=title_column, show_failure=False
    )
    _print_added(await _said_once(job))


async def _said_once(job: Awaitable[list[AddResult]]) -> list[AddResult]:
    """``job``'s results; a failure is said once, as the cell's error (its bar hid itself)."""
    from ..knowledge.model import KnowledgeError

    try:
        return await job
    except KnowledgeError as exc:
        raise UsageError(str(exc)) from None


def _print_added(results: list[AddResult]) -> None:
    from .widgets.ingest import skipped_files

    for result in results:
        doc = result.document
        mark = "+" if result.created else "="
        print(f"  {mark} [{doc.id}] {doc.title} · {doc.chunks} chunk(s) · {doc.source}")
    for _, why in skipped_files(results):
        print(f"  ! skipped {why}")
