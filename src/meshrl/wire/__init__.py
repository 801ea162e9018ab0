"""The wire shared by every role: signed requests (EIP-191), the client helper, the HTTP service
scaffolding (aiohttp + pydantic + OpenAPI), request/response models and the rollout file schema.

No torch and nothing of meshrl but `config` and `log`: the layering test keeps it so.
"""

from __future__ import annotations

from meshrl.lazy import lazy_getattr

_EXPORTS = {
    "RolloutFileError": "errors",
    "WireError": "errors",
    "WireHTTPError": "errors",
    "WireUnavailable": "errors",
    "SignedHeaders": "signing",
    "address_of": "signing",
    "recover_signer": "signing",
    "request_message": "signing",
    "sign_request": "signing",
    "GuardConfig": "guard",
    "RequestGuard": "guard",
    "VerifiedRequest": "guard",
    "NonceStore": "nonces",
    "SqliteNonceStore": "nonces",
    "SignedClient": "client",
    "Call": "service",
    "Route": "service",
    "build_app": "service",
    "openapi_document": "service",
    "Completion": "rollout_file",
    "RolloutFile": "rollout_file",
    "RolloutHeader": "rollout_file",
    "SCHEMA_VERSION": "rollout_file",
    "read_rollout_file": "rollout_file",
    "rollout_file_bytes": "rollout_file",
    "write_rollout_file": "rollout_file",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("meshrl.wire", _EXPORTS)


def __dir__() -> list[str]:
    return __all__
