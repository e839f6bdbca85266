"""idemgate: idempotency keys for AI-agent tool calls, through the idemgate HTTP gateway.

Reserve a key before the side effect runs, store the outcome, replay it to duplicates::

    from idemgate import Client, derive_key, idempotent

    client = Client("http://127.0.0.1:8080", token="...")

    @idempotent(client, "send_invoice", key=lambda run_id, step, invoice: derive_key(run_id, step))
    def send_invoice(run_id, step, invoice):
        ...
"""

from .client import Begin, CallResult, Client, Completion, Outcome, Record, parse_time
from .decorator import idempotent
from .errors import (
    BadRequest,
    Conflict,
    Failed,
    GatewayTimeout,
    GatewayUnreachable,
    IdemgateError,
    NotResolvable,
    InFlight,
    KeyRequired,
    KeyReused,
    LeaseLost,
    NotApplied,
    NotFound,
    OutcomeNotRecorded,
    OutcomeUnknown,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    StoreUnavailable,
    Unauthorized,
    UpstreamUnreachable,
)
from .keys import check_key, derive_key, mint_key

__version__ = "0.1.0"

__all__ = [
    "BadRequest",
    "Begin",
    "CallResult",
    "Client",
    "Completion",
    "Conflict",
    "Failed",
    "GatewayTimeout",
    "GatewayUnreachable",
    "IdemgateError",
    "InFlight",
    "KeyRequired",
    "KeyReused",
    "LeaseLost",
    "NotApplied",
    "NotFound",
    "NotResolvable",
    "Outcome",
    "OutcomeNotRecorded",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "QuotaExceeded",
    "RateLimited",
    "Record",
    "StoreUnavailable",
    "Unauthorized",
    "UpstreamUnreachable",
    "check_key",
    "derive_key",
    "idempotent",
    "mint_key",
    "parse_time",
]
