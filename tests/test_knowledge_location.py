"""Where the knowledge tables live (``kb.uri``): a folder of one's own, or an S3 object store.

Real LanceDB every time; the object store is moto's S3 server on 127.0.0.1 (a thread of this
process: the `s3_server` fixture of tests/conftest.py), with the bucket made by boto3 and the
credentials given in ``kb.storage_options``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _s3 import BUCKET, SECRET_KEY, bucket_keys, s3_options

from ania_nb.config import Config
from ania_nb.errors import ConfigError
from ania_nb.knowledge import Knowledge

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

DEPLOY = "Deploy the service with the blue-green script; the canary runs ten minutes first."


def endpoint_config(llm: Any, **overrides: Any) -> Config:
    """Vectors from the scripted server's /embeddings, so search is hybrid (vectors and FTS)."""
    values: dict[str, Any] = {
        "embedding.provider": "endpoint",
        "embedding.base_url": llm.base_url,
        "embedding.api_key": llm.api_key,
        "embedding.model": "scripted-embed",
    }
    values.update(overrides)
    return Config().with_overrides(values)


async def ingest_and_search(knowledge: Knowledge) -> None:
    """A document added, found by meaning and keywords; a memory saved and found."""
    added = await knowledge.kb.add("nb:a", "Deploying", DEPLOY, tags=["ops"])
    assert added.created
    await knowledge.wait_reembedded()
    [hit] = await knowledge.kb.search("how do we deploy the service", ["nb:a"])
    assert hit.doc_id == added.document.id and "blue-green" in hit.text
    assert hit.similarity is not None  # the vectors were stored and read back too
    [fts] = await knowledge.kb.search("canary", ["nb:a"], mode="fts")
    assert fts.doc_id == added.document.id
    entry, new = await knowledge.memory.save("nb:a", "The on-call rota changes on Mondays.")
    assert new
    assert [m.id for m in await knowledge.memory.search("nb:a", "on-call rota")] == [entry.id]


async def test_a_folder_uri_holds_the_kb_and_the_memories(llm: Any, tmp_path: Path) -> None:
    elsewhere = tmp_path / "shared-kb"
    data_dir = tmp_path / "data"
    knowledge = Knowledge(endpoint_config(llm, **{"kb.uri": str(elsewhere)}), data_dir)
    assert not knowledge.exists()
    try:
        await ingest_and_search(knowledge)
    finally:
        await knowledge.aclose()
    assert {p.name for p in elsewhere.glob("*.lance")} == {"kb_chunks.lance", "memories.lance"}
    assert not (data_dir / "knowledge").exists()  # nothing in the default place
    again = Knowledge(endpoint_config(llm, **{"kb.uri": f"file://{elsewhere}"}), tmp_path / "x")
    try:
        assert again.exists()
        assert [d.title for d in await again.kb.documents("nb:a")] == ["Deploying"]
    finally:
        await again.aclose()


async def test_an_s3_uri_ingests_and_searches_in_the_bucket(
    llm: Any, s3_server: str, tmp_path: Path
) -> None:
    overrides = {"kb.uri": f"s3://{BUCKET}/bots/one", "kb.storage_options": s3_options(s3_server)}
    knowledge = Knowledge(endpoint_config(llm, **overrides), tmp_path / "data")
    try:
        await ingest_and_search(knowledge)
    finally:
        await knowledge.aclose()
    keys = bucket_keys(s3_server)
    assert any(k.startswith("bots/one/kb_chunks.lance/") for k in keys)
    assert any(k.startswith("bots/one/memories.lance/") for k in keys)
    assert not (tmp_path / "data" / "knowledge").exists()
    reopened = Knowledge(endpoint_config(llm, **overrides), tmp_path / "other")  # another host
    try:
        assert [d.title for d in await reopened.kb.documents("nb:a")] == ["Deploying"]
    finally:
        await reopened.aclose()


def test_kb_uri_takes_folders_and_object_stores_and_names_a_wrong_scheme() -> None:
    for uri in ("", "kb-folder", "/srv/kb", "file:///srv/kb", "s3://b/p", "gs://b/p", "az://c/p"):
        assert Config().with_overrides({"kb.uri": uri}).kb.uri == uri
    with pytest.raises(ConfigError, match=r"kb\.uri must be .* not a http:// URI"):
        Config().with_overrides({"kb.uri": "http://example.org/kb"})


def test_storage_options_are_masked_wherever_the_config_is_shown() -> None:
    config = Config().with_overrides({"kb.storage_options": s3_options("http://127.0.0.1:9")})
    shown = {info.key: info for info in config.describe()}["kb.storage_options"]
    assert shown.sensitive
    assert set(shown.value) == set(s3_options("x"))  # the option names stay readable
    assert SECRET_KEY not in repr(config) + str(config.masked()) + str(shown.value)
    assert config.kb.storage_options["aws_secret_access_key"].get_secret_value() == SECRET_KEY


async def test_an_unreachable_object_store_is_a_clear_error_naming_kb_uri(tmp_path: Path) -> None:
    from ania_nb.knowledge import KnowledgeError

    overrides = {
        "embedding.provider": "none",
        "kb.uri": f"s3://{BUCKET}/p",
        "kb.storage_options": s3_options(f"http://127.0.0.1:{closed_port()}"),
    }
    knowledge = Knowledge(Config().with_overrides(overrides), tmp_path)
    try:
        with pytest.raises(KnowledgeError, match=rf"s3://{BUCKET}/p \(kb\.uri\)") as caught:
            await knowledge.kb.documents("nb:a")
    finally:
        await knowledge.aclose()
    assert SECRET_KEY not in str(caught.value)


def closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
