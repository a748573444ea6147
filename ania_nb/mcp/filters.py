"""Tool filters: choose which of an MCP server's tools ania-nb exposes.

A server entry of the MCP config file may carry a ``"filter"`` object. Its JSON form::

    {"prefix": "get_"}                      # name starts with the prefix (or any of a list)
    {"prefix": ["get_", "list_"]}
    {"names": ["read_file", "search"]}      # name is one of these (exact)
    {"keywords": ["time", "zone"]}          # description contains any keyword (ignoring case)
    {"any": [F, F, ...]}                    # at least one sub-filter matches (OR)
    {"all": [F, F, ...]}                    # every sub-filter matches (AND)
    {"not": F}                              # the sub-filter does not match

Several keys in one object must all match (AND), so ``{"prefix": "get_", "keywords": ["utc"]}``
keeps the ``get_*`` tools that mention UTC. Example with OR::

    "filter": {"any": [{"prefix": "get_"}, {"names": ["convert_time"]}]}

An object without any of these keys, an unknown key or an empty list is a configuration error.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["ToolFilter"]


class ToolFilter(BaseModel):
    """One node of a tool filter (see the module docstring for the JSON form)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    prefix: list[str] | None = Field(None, description="Name starts with any of these.")
    names: list[str] | None = Field(None, description="Name is exactly one of these.")
    keywords: list[str] | None = Field(
        None, description="Description contains any of these (case-insensitive)."
    )
    all_: list[ToolFilter] | None = Field(None, alias="all", description="Every one matches.")
    any_: list[ToolFilter] | None = Field(None, alias="any", description="One of them matches.")
    not_: ToolFilter | None = Field(None, alias="not", description="This one does not match.")

    @field_validator("prefix", mode="before")
    @classmethod
    def _one_prefix(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("prefix", "names", "keywords", "all_", "any_")
    @classmethod
    def _not_empty(cls, value: list[Any] | None) -> list[Any] | None:
        if value is not None and not value:
            raise ValueError("must not be an empty list (drop the key to match everything)")
        if value is not None and any(isinstance(v, str) and not v.strip() for v in value):
            raise ValueError("must not contain empty strings")
        return value

    @model_validator(mode="after")
    def _has_a_rule(self) -> ToolFilter:
        if not self.model_fields_set:
            raise ValueError(
                "a filter needs at least one of prefix, names, keywords, any, all, not"
            )
        return self

    def matches(self, name: str, description: str | None) -> bool:
        """Whether a tool with this name and description passes the filter."""
        text = (description or "").casefold()
        checks = (
            self.prefix is None or any(name.startswith(p) for p in self.prefix),
            self.names is None or name in self.names,
            self.keywords is None or any(k.casefold() in text for k in self.keywords),
            self.all_ is None or all(f.matches(name, description) for f in self.all_),
            self.any_ is None or any(f.matches(name, description) for f in self.any_),
            self.not_ is None or not self.not_.matches(name, description),
        )
        return all(checks)

    def to_json(self) -> dict[str, Any]:
        """The JSON form this filter was written in (for saving it back)."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")
