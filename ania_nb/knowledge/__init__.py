"""Knowledge base and long-term memory on LanceDB (hybrid full-text + vector search)."""
