"""One replica of a knowledge race (tests/test_knowledge_replicas.py): add, report as JSON.

Run as ``python tests/_kb_replica_worker.py <spec JSON>``. The worker opens the knowledge
store at the spec's ``kb.uri`` (moto's S3 server), prints ``ready``, waits for a line on stdin
(the barrier: the test releases both processes at once), adds the spec's documents and saves
its memories one call at a time (a commit each, so the two processes interleave), and prints
one JSON line: for every document and memory, its id and whether this process created it, or
the refusal it got.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


async def main(spec: dict[str, Any]) -> None:
    from ania_nb.config import Config
    from ania_nb.knowledge import Knowledge, KnowledgeError

    knowledge = Knowledge(Config().with_overrides(spec["config"]), spec["data_dir"])
    await knowledge.open()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    docs: list[dict[str, Any]] = []
    for title, content in spec["docs"]:
        try:
            added = await knowledge.kb.add(spec["scope"], title, content)
        except KnowledgeError as exc:
            docs.append({"title": title, "refused": str(exc)})
        else:
            docs.append({"title": title, "id": added.document.id, "created": added.created})
    memories: list[dict[str, Any]] = []
    for content in spec["memories"]:
        try:
            entry, new = await knowledge.memory.save(spec["scope"], content)
        except KnowledgeError as exc:
            memories.append({"content": content, "refused": str(exc)})
        else:
            memories.append({"content": content, "id": entry.id, "created": new})
    await knowledge.aclose()
    print(json.dumps({"docs": docs, "memories": memories}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
