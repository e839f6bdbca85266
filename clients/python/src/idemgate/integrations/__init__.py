"""Framework integrations of the in-process engine: each gates a framework's tool functions
once per logical action, so a retried or re-emitted call gets the stored result instead of
running the side effect again. What counts as the same action (``clients/python/README.md``):

- the framework's tool-call id **within a scope**, the conversation the framework knows (a call id
  names a message, not an action, and some models reuse ids: the same id in another scope is
  another action); a framework that names no conversation gives the run, else the invocation:
  never global;
- within the scope, a write whose arguments equal an earlier call's within the tool's window
  (``fallback_window``, default :data:`DEFAULT_WINDOW`, 0 turns it off), whatever its call id;
- a deliberate repeat: the model passes a new ``idempotency_key`` argument; the program names
  the action itself with ``key=`` (a business identity, the same in every conversation).

All of it is named by the one rule of every door (the native ``name_action``,
``idemgate_kit::identity``). Never silent: every call that did not run tells the model so in
words, with the stored result (:func:`repeat_notice` for the window, :func:`key_notice` for a
re-sent call id, the model's key used again, the program's key), naming the tool as the model
calls it; a retry past the record's TTL, within its tombstone (``OutcomeExpired``), is told
that the action already ran then, was not performed again, that its result is no longer kept,
and how to do it again on purpose (:func:`expired_notice`).

- :mod:`idemgate.integrations.openai_agents`: the OpenAI Agents SDK (``ToolContext.tool_call_id``;
  a ``tool_meta_resolver`` for MCP servers behind ``idemgate mcp``);
- :mod:`idemgate.integrations.pydantic_ai`: Pydantic AI (``RunContext.tool_call_id``; a
  ``process_tool_call`` for MCP servers behind ``idemgate mcp``);
- :mod:`idemgate.integrations.langgraph`: LangChain / LangGraph tools (``InjectedToolCallId``);
- :mod:`idemgate.integrations.langchain`: any LangChain ``BaseTool`` (``@tool``, ``StructuredTool``,
  langchain-mcp-adapters' tools), keyed by the ``ToolCall`` id it is invoked with;
- :mod:`idemgate.integrations.crewai`: any CrewAI ``BaseTool`` (``@tool``...); CrewAI hands a tool
  no call id, so the window names its actions, within the ``Flow`` or the kickoff;
- :mod:`idemgate.integrations.fastmcp`: a FastMCP server middleware gating its own write tools.

Each module imports its framework only when used: the package itself has no Python dependencies.
"""

from ._tool_calls import (
    CALL_ID_META,
    CONVERSATION_META,
    DEFAULT_WINDOW,
    KEY_ARGUMENT,
    KEY_META,
    expired_notice,
    jsonable,
    key_notice,
    repeat_notice,
    scoped_key,
)

__all__ = [
    "CALL_ID_META",
    "CONVERSATION_META",
    "DEFAULT_WINDOW",
    "KEY_ARGUMENT",
    "KEY_META",
    "expired_notice",
    "jsonable",
    "key_notice",
    "repeat_notice",
    "scoped_key",
]
