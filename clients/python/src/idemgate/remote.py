"""The HTTP client of a remote gateway (``idemgate serve``, see docs/HTTP.md): for tools whose
calls go through a gateway another process runs. In-process, :class:`idemgate.Engine` does the
same without a gateway.

    from idemgate.remote import Client, idempotent

    client = Client("http://127.0.0.1:8080", token="...")

    @idempotent(client, "send_invoice", key=lambda run_id, step, invoice: derive_key(run_id, step))
    def send_invoice(run_id, step, invoice): ...
"""

from .client import (
    AsyncClient,
    Begin,
    CallResult,
    Client,
    Completion,
    Outcome,
    Record,
    parse_time,
)
from .gateway_decorator import idempotent
from .errors import GatewayTimeout, GatewayUnreachable, Unauthorized, UpstreamUnreachable

__all__ = [
    "AsyncClient",
    "Begin",
    "CallResult",
    "Client",
    "Completion",
    "GatewayTimeout",
    "GatewayUnreachable",
    "Outcome",
    "Record",
    "Unauthorized",
    "UpstreamUnreachable",
    "idempotent",
    "parse_time",
]
