"""A process ingesting past ``kb.ann_threshold`` (tests/test_knowledge_store.py kills it).

Run as ``python tests/_kb_ingest_worker.py <spec JSON>``. The worker opens the knowledge store
of the spec's data directory with the spec's settings and adds ``spec["docs"]`` documents one
by one (a commit each), so the table's own background upkeep starts the ANN index build once
past the threshold. The knowledge tables' log goes to stderr, where the test waits for
"building the ANN index" and kills the process. Left alone it prints ``done`` at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any


def document(i: int) -> tuple[str, str]:
    """The ``i``-th document: a title and text that a search can find again."""
    words = " ".join(f"topic{i}-part{j} about subject {i % 7} and item {j}" for j in range(24))
    return f"Document {i}", words


async def main(spec: dict[str, Any]) -> None:
    from ania_nb.config import Config
    from ania_nb.knowledge import Knowledge

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    logging.getLogger("ania_nb.knowledge.tables").setLevel(logging.INFO)
    knowledge = Knowledge(Config().with_overrides(spec["config"]), spec["data_dir"])
    for i in range(spec["docs"]):
        title, text = document(i)
        await knowledge.kb.add(spec["scope"], title, text)
    await knowledge.store.wait_upkeep()
    print("done", flush=True)
    await knowledge.aclose()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
