"""Framework integrations of the in-process engine: each gates a framework's tool functions,
keyed by the tool-call id the framework gives them, so a re-emitted or retried call gets the
stored result instead of running the side effect again.

- :mod:`idemgate.integrations.openai_agents`: the OpenAI Agents SDK (``ToolContext.tool_call_id``;
  a ``tool_meta_resolver`` for MCP servers behind ``idemgate mcp``);
- :mod:`idemgate.integrations.pydantic_ai`: Pydantic AI (``RunContext.tool_call_id``; a
  ``process_tool_call`` for MCP servers behind ``idemgate mcp``);
- :mod:`idemgate.integrations.langgraph`: LangChain / LangGraph tools (``InjectedToolCallId``);
- :mod:`idemgate.integrations.fastmcp`: a FastMCP server middleware gating its own write tools.

Each module imports its framework only when used: the package itself has no Python dependencies.
"""

from ._gate import KEY_META, jsonable

__all__ = ["KEY_META", "jsonable"]
