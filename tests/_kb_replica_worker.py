"""One replica of a knowledge race (tests/test_knowledge_replicas.py): add in lockstep, report.

Run as ``python tests/_kb_replica_worker.py <spec JSON>``. The worker opens the knowledge
store at the spec's ``kb.uri`` (moto's S3 server) and prints ``ready``. Then, for each of the
spec's documents and then each of its memories, it waits for a line on stdin (the test sends
one to every replica at once, so their calls overlap), adds that one document or saves that
one memory (a commit each), and prints one JSON line: the id and whether this process
created it, or the refusal it got.
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
    scope = spec["scope"]
    for kind, item in [
        *(("doc", d) for d in spec["docs"]),
        *(("memory", m) for m in spec["memories"]),
    ]:
        await asyncio.to_thread(sys.stdin.readline)
        report: dict[str, Any] = {"kind": kind, "item": item}
        try:
            if kind == "doc":
                added = await knowledge.kb.add(scope, item[0], item[1])
                report.update(id=added.document.id, created=added.created)
            else:
                entry, new = await knowledge.memory.save(scope, item)
                report.update(id=entry.id, created=new)
        except KnowledgeError as exc:
            report["refused"] = str(exc)
        print(json.dumps(report), flush=True)
    await knowledge.aclose()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
