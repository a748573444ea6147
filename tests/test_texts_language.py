"""One language for the model: every text the package writes is English, except where Chinese
is what chat users of the original meet [design §9].

The catalogue below is the whole list of those places: a module that reads chat users (the
runner, the notebook's panels, the approval words, the chat notices) or a marker the original's
users know (``【定时任务】``, ``【知识库】`` …). Anything else with Chinese in a string — a tool
result such as kb_add's ``已加入知识库…`` in an English conversation (issue 36) — fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ania_nb

PACKAGE = Path(ania_nb.__file__).parent
CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")

USER_FACING = {
    "catalogue.py": "the message catalogue: every text people read, in English and Chinese",
    "runner/": "the chat runner: the platform's markers, the answer word 查看, a CJK rule",
    "notebook/": "the notebook's panels show titles as the original shows them",
    "governance/approval.py": "the approval answer words (允许/拒绝 …)",
    "agents/roles.py": "the team roles' names in both languages (规划师 or planner)",
    "demo.py": "the demo's Chinese sample documents",
    "cli.py": "ania-nb chat's help names the chat's answer words (允许, 拒绝)",
    "testing/chat.py": "ania-nb chat: the chat user's side, its help names the answer words",
    "testing/_corpus.py": "the bilingual distractor corpus of the knowledge scale bench",
}
NOT_TEXT = {
    "engine/untrusted.py": "look-alike brackets it neutralises",
    "knowledge/chunking.py": "character ranges of the n-gram tokenizer",
    "knowledge/search.py": "character ranges of the keyword matcher",
}
MARKERS = {
    # the trigger, with its note
    "clock/runner.py": ("【定时任务】", "（备注：", "）"),
    "agents/subagent.py": ("【子代理任务】",),
    "agents/clock_children.py": ("【子代理执行结果汇总】",),
    "knowledge/inject.py": ("【知识库】", "【长期记忆】"),
}


def _texts(tree: ast.Module) -> list[str]:
    """The module's string constants, docstrings left out (they are for developers)."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def chinese_texts() -> dict[str, list[str]]:
    """Per module outside the catalogue: its texts with Chinese in them (markers removed)."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where in NOT_TEXT or any(where.startswith(part) for part in USER_FACING):
            continue
        for text in _texts(ast.parse(path.read_text(encoding="utf-8"))):
            for marker in MARKERS.get(where, ()):
                text = text.replace(marker, "")
            if CJK.search(text):
                found.setdefault(where, []).append(text[:60])
    return found


def test_model_facing_texts_are_english() -> None:
    assert chinese_texts() == {}


def test_the_catalogue_names_only_what_exists() -> None:
    for where in [*USER_FACING, *NOT_TEXT, *MARKERS]:
        assert (PACKAGE / where).exists(), where
    for where, markers in MARKERS.items():
        source = (PACKAGE / where).read_text(encoding="utf-8")
        assert all(marker in source for marker in markers), where
