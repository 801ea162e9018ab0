"""The wire shared by every role: signed requests (EIP-191), the client helper, the HTTP service
scaffolding (aiohttp + pydantic + OpenAPI), request/response models and the rollout file schema.
Every refusal has an `ErrorCode`; the client raises one `WireHTTPError` subclass per code.

No torch and nothing of meshrl but `config` and `log`: the layering test keeps it so.
"""

from __future__ import annotations

from meshrl.lazy import lazy_getattr

_EXPORTS = {
    "ErrorBody": "errors",
    "ErrorCode": "errors",
    "RolloutFileError": "errors",
    "WireError": "errors",
    "WireHTTPError": "errors",
    "WireUnavailable": "errors",
    "refusal": "errors",
    "refusal_classes": "errors",
    "BadFileName": "errors",
    "BadPoolId": "errors",
    "BadSignature": "errors",
    "BadSlotId": "errors",
    "BodySha256Mismatch": "errors",
    "BodyTooLarge": "errors",
    "CounterOutOfRange": "errors",
    "CounterUsed": "errors",
    "FileAlreadyKnown": "errors",
    "FileAlreadyUploaded": "errors",
    "NotARolloutFile": "errors",
    "UploadInProgress": "errors",
    "FileTooLarge": "errors",
    "FutureTimestamp": "errors",
    "HttpRefused": "errors",
    "InvalidBody": "errors",
    "InvalidQuery": "errors",
    "MalformedAddress": "errors",
    "MalformedBodySha256": "errors",
    "MalformedJson": "errors",
    "MalformedNonce": "errors",
    "MalformedTimestamp": "errors",
    "MethodNotAllowed": "errors",
    "MissingSignature": "errors",
    "NoInvite": "errors",
    "NoSuchFile": "errors",
    "NoSuchRoute": "errors",
    "NoSuchSlot": "errors",
    "NoSuchSubmission": "errors",
    "NodeNotOnChain": "errors",
    "NonceStoreUnavailable": "errors",
    "NotAReader": "errors",
    "NotAValidator": "errors",
    "NotAnnounced": "errors",
    "NotAwaitingVerdict": "errors",
    "NotInPool": "errors",
    "NotOwnEntry": "errors",
    "NotPoolManager": "errors",
    "NotSubmittedYet": "errors",
    "ProviderMismatch": "errors",
    "RateLimited": "errors",
    "ReplayedNonce": "errors",
    "Sha256Mismatch": "errors",
    "SizeMismatch": "errors",
    "SlotAlreadyUsed": "errors",
    "SlotExpired": "errors",
    "SlotOfAnotherNode": "errors",
    "StaleTimestamp": "errors",
    "StaleWork": "errors",
    "StepGoesBack": "errors",
    "TooManyNodesForIp": "errors",
    "TooManyWorkUnits": "errors",
    "WorkIdOfAnotherFile": "errors",
    "WrongSigner": "errors",
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
    "raise_for": "client",
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
