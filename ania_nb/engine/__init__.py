"""The engine: LLM client, messages, the tool loop, the context window and the callbacks bridge.

The engine knows nothing of notebooks, chat platforms or concrete tools: tools are reached
through the small `ToolRunner` protocol in `loop`, front ends through `Callbacks`.
"""
