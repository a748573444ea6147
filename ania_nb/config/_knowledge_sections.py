"""Config sections of the knowledge base, long-term memory and the embedder they share."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from ._locations import check_kb_uri
from ._sections import Endpoint, Section, _secret


class EmbeddingSettings(Endpoint):
    """The embedder shared by the knowledge base and long-term memory."""

    base_url: str = Field("", description="Endpoint of /embeddings; empty = the main model's.")
    api_key: SecretStr | None = _secret("API key of the endpoint; empty = the main model's.")
    model: str = Field(
        "jina-embeddings-v3",
        min_length=1,
        description="Embedding model of the endpoint (an embeddings model, never the chat one).",
    )
    provider: Literal["offline", "endpoint", "none"] = Field(
        "offline",
        description=(
            "offline = multilingual USE v3 in numpy (no download, no key); endpoint = an "
            "OpenAI-compatible /embeddings; none = full-text search only."
        ),
    )
    timeout: float = Field(30.0, gt=0, description="Seconds one embeddings request may take.")
    inject_timeout: float = Field(
        10.0, gt=0, description="Seconds for the query vector of an auto-inject (then full-text)."
    )
    batch_size: int = Field(64, ge=1, le=2048, description="Texts per embeddings request.")


class KbSettings(Section):
    """The knowledge base: documents cut into chunks, searched by keywords and meaning."""

    enable: bool = Field(True, description="Give sessions kb_search/kb_add/kb_list/kb_delete.")
    uri: str = Field(
        "",
        description="Where the knowledge tables (kb chunks and long-term memories) live: empty "
        "= the 'knowledge' folder in store.data_dir; a folder; or an object-store URI "
        "(s3://bucket/prefix, gs://bucket/prefix, az://container/prefix) with "
        "kb.storage_options for its endpoint and credentials.",
    )
    storage_options: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Options of the object store at kb.uri, passed to LanceDB as they are "
        "(e.g. aws_endpoint, aws_region, aws_access_key_id, aws_secret_access_key, "
        "allow_http); values masked wherever shown.",
        json_schema_extra={"sensitive": "mapping"},
    )
    refresh_seconds: float = Field(
        5.0,
        ge=0,
        description="Seconds a read may lag behind documents and memories other processes "
        "(replicas sharing kb.uri) stored; 0 = look before every read. A process's own "
        "writes, dedupe and the per-scope limits always read the newest version.",
    )
    max_docs: int = Field(500, ge=1, description="Documents per scope (kb_add refuses beyond).")
    max_content_chars: int = Field(
        8000, ge=100, description="Characters of one kb_add document (longer is cut with …)."
    )
    chunk_chars: int = Field(600, ge=50, le=20000, description="Characters per chunk (at most).")
    chunk_overlap_chars: int = Field(
        60, ge=0, description="Characters repeated from the end of the previous chunk."
    )
    vector_weight: float = Field(
        0.8,
        ge=0,
        le=1,
        description="Weight of meaning vs keyword share in the hybrid score (bench: 0.8 best).",
    )
    auto_inject: bool = Field(True, description="Put matching chunks into each main turn.")
    inject_top_k: int = Field(3, ge=1, le=10, description="Chunks an auto-inject may add.")
    inject_min_similarity: float = Field(
        0.35, ge=0, le=1, description="Vector similarity that qualifies a chunk for auto-inject."
    )
    inject_min_match: float = Field(
        0.6, ge=0, le=1, description="Share of the query's keywords a chunk must contain instead."
    )
    inject_chars: int = Field(
        400, ge=50, description="Characters of each auto-injected chunk (rest cut with …)."
    )
    exact_search: Literal["terms", "query", "off"] = Field(
        "terms",
        description="Once a table has its ANN index, what of a query naming something exact "
        "(digits, identifiers, quotes) also asks the full-text index: terms = those parts only; "
        "query = the whole query (slow at scale); off = nothing (vector candidates only).",
    )
    ann_threshold: int = Field(
        20000, ge=1000, description="Rows with vectors past which an ANN index is built."
    )
    ann_index: Literal["ivf_flat", "ivf_hnsw_sq", "ivf_sq", "ivf_pq"] = Field(
        "ivf_flat",
        description="Kind of ANN index built past kb.ann_threshold (cosine); a change applies "
        "when the index is next built (bench/knowledge.py --scale measures the kinds).",
    )
    ann_partitions: int = Field(
        0, ge=0, description="IVF partitions of the ANN index; 0 = LanceDB's choice by size."
    )
    ann_nprobes: int = Field(
        0, ge=0, description="IVF partitions an ANN search probes; 0 = LanceDB's default (20)."
    )
    ann_ef: int = Field(
        0, ge=0, description="HNSW candidates an ANN search keeps; 0 = LanceDB's (1.5 × limit)."
    )
    ann_refine_factor: int = Field(
        1,
        ge=1,
        description="ANN candidates re-ranked by their stored vectors, × limit (at least 1: the "
        "quantised distances of IVF-HNSW-SQ are not cosine distances).",
    )

    @field_validator("uri")
    @classmethod
    def _folder_or_object_store(cls, value: str) -> str:
        """A folder or a URI LanceDB opens (s3, gs, az, file)."""
        return check_kb_uri(value)


class MemorySettings(Section):
    """Long-term memory: short notes the AI keeps per session."""

    enable: bool = Field(True, description="Give sessions memory_save/memory_search/memory_forget.")
    max_entries: int = Field(200, ge=1, description="Memories per scope (memory_save refuses).")
    max_chars: int = Field(2000, ge=10, description="Characters of one memory (rest cut with …).")
    auto_inject: bool = Field(False, description="Put matching memories into each main turn.")
    inject_max: int = Field(
        3, ge=0, description="Memories an auto-inject may add; 0 = as many as the budget allows."
    )
    inject_chars: int = Field(
        1500, ge=50, description="Character budget of the injected memory block."
    )
