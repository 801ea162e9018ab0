# over 400 lines: the one table of every refusal code with its class and family (the contract
#  between all roles)
"""Typed errors of the wire. Every refusal a service makes has an `ErrorCode` (which fixes its
HTTP status), and is answered as `{"error": <short reason>, "code": <code>, "detail": ...}`.
The client raises one `WireHTTPError` subclass per code, so callers branch on the type, never
on the text; a code this version does not know arrives as the base class.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from pydantic import BaseModel

__all__ = [
    "BadBatchId",
    "BadFileName",
    "BadLeaf",
    "BadPoolId",
    "BadSignature",
    "BadSlotId",
    "BatchMismatch",
    "BatchTooLarge",
    "BodyIncomplete",
    "BodySha256Mismatch",
    "BodyTooLarge",
    "ChainUnavailable",
    "CounterOutOfRange",
    "CounterUsed",
    "ErrorBody",
    "ErrorCode",
    "FileAlreadyKnown",
    "FileAlreadyUploaded",
    "FileInAnotherBatch",
    "FileTooLarge",
    "FutureTimestamp",
    "HttpRefused",
    "InvalidBody",
    "InvalidQuery",
    "IpRateLimited",
    "MalformedAddress",
    "MalformedBodySha256",
    "MalformedJson",
    "MalformedNonce",
    "MalformedTimestamp",
    "MethodNotAllowed",
    "MissingSignature",
    "NoInvite",
    "NoSuchBatch",
    "NoSuchFile",
    "NoSuchRoute",
    "NoSuchSlot",
    "NoSuchSubmission",
    "NodeNotOnChain",
    "NonceStoreUnavailable",
    "NotAReader",
    "NotARolloutFile",
    "NotAValidator",
    "NotAnnounced",
    "NotAuthorized",
    "NotAwaitingVerdict",
    "NotFound",
    "NotInPool",
    "NotOwnEntry",
    "NotPoolManager",
    "NotSubmittedYet",
    "ProviderMismatch",
    "RateLimited",
    "Refused",
    "ReplayedNonce",
    "RequestTimeout",
    "RolloutFileError",
    "Sha256Mismatch",
    "SizeMismatch",
    "SlotAlreadyUsed",
    "SlotExpired",
    "SlotOfAnotherNode",
    "StaleTimestamp",
    "StaleWork",
    "StepGoesBack",
    "TakenBeyondAccepted",
    "TooManyHeld",
    "TooManyNodesForIp",
    "TooManyWorkUnits",
    "Transient",
    "UnsubmittedUploads",
    "UploadInProgress",
    "WireError",
    "WireHTTPError",
    "WireUnavailable",
    "WorkIdOfAnotherFile",
    "WrongAudience",
    "WrongSigner",
    "family_of",
    "refusal",
    "refusal_classes",
]


class ErrorCode(StrEnum):
    """A refusal's machine-readable code; `status` is its HTTP status, `reason` the short
    human text of the body's `error` field. docs/wire.md lists what each one means."""

    status: int
    reason: str

    def __new__(cls, value: str, status: int, reason: str) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status, member.reason = status, reason
        return member

    # the signed request and the HTTP layer (every route)
    BODY_TOO_LARGE = "body_too_large", 413, "body too large"
    BODY_SHA256_MISMATCH = "body_sha256_mismatch", 400, "body sha256 mismatch"
    MISSING_SIGNATURE = "missing_signature", 401, "missing signature headers"
    MALFORMED_ADDRESS = "malformed_address", 400, "malformed address"
    MALFORMED_NONCE = "malformed_nonce", 400, "malformed nonce"
    MALFORMED_TIMESTAMP = "malformed_timestamp", 400, "malformed timestamp"
    MALFORMED_BODY_SHA256 = "malformed_body_sha256", 400, "malformed body sha256"
    STALE_TIMESTAMP = "stale_timestamp", 401, "stale timestamp"
    FUTURE_TIMESTAMP = "future_timestamp", 401, "future timestamp"
    BAD_SIGNATURE = "bad_signature", 401, "bad signature"
    WRONG_SIGNER = "wrong_signer", 401, "signature of another address"
    WRONG_AUDIENCE = "wrong_audience", 401, "signed for another service"
    RATE_LIMITED = "rate_limited", 429, "rate limit"
    IP_RATE_LIMITED = "ip_rate_limited", 429, "too many requests from this IP address"
    REPLAYED_NONCE = "replayed_nonce", 409, "replayed nonce"
    NONCE_STORE_UNAVAILABLE = "nonce_store_unavailable", 503, "nonce store unavailable"
    REQUEST_TIMEOUT = "request_timeout", 408, "request body too slow"
    BODY_INCOMPLETE = "body_incomplete", 400, "body cut short"
    MALFORMED_JSON = "malformed_json", 400, "malformed json"
    INVALID_BODY = "invalid_body", 422, "invalid body"
    INVALID_QUERY = "invalid_query", 422, "invalid query"
    NO_SUCH_ROUTE = "no_such_route", 404, "no such route"
    METHOD_NOT_ALLOWED = "method_not_allowed", 405, "method not allowed"
    HTTP_REFUSED = "http_refused", 400, "refused"  # any other refusal of aiohttp: its status
    # the orchestrator
    NOT_IN_POOL = "not_in_pool", 403, "not in pool"
    NOT_A_READER = "not_a_reader", 403, "not a reader"
    NOT_A_VALIDATOR = "not_a_validator", 403, "not a validator"
    NO_INVITE = "no_invite", 404, "no invite"
    FILE_TOO_LARGE = "file_too_large", 413, "file too large"
    TOO_MANY_WORK_UNITS = "too_many_work_units", 422, "too many work units"
    STALE_WORK = "stale_work", 409, "stale work"
    FILE_ALREADY_KNOWN = "file_already_known", 409, "file already known"
    BAD_SLOT_ID = "bad_slot_id", 400, "bad slot id"
    NO_SUCH_SLOT = "no_such_slot", 404, "no such slot"
    SLOT_OF_ANOTHER_NODE = "slot_of_another_node", 403, "slot of another node"
    SLOT_ALREADY_USED = "slot_already_used", 409, "slot already used"
    SLOT_EXPIRED = "slot_expired", 410, "slot expired"
    COUNTER_OUT_OF_RANGE = "counter_out_of_range", 422, "counter out of range"
    COUNTER_USED = "counter_used", 409, "counter used by another file"
    FILE_ALREADY_UPLOADED = "file_already_uploaded", 409, "file already uploaded"
    UPLOAD_IN_PROGRESS = "upload_in_progress", 409, "upload in progress"
    NOT_A_ROLLOUT_FILE = "not_a_rollout_file", 422, "not a rollout file"
    SHA256_MISMATCH = "sha256_mismatch", 400, "sha256 mismatch"
    SIZE_MISMATCH = "size_mismatch", 400, "size mismatch"
    BAD_FILE_NAME = "bad_file_name", 400, "bad file name"
    NO_SUCH_FILE = "no_such_file", 404, "no such file"
    NO_SUCH_SUBMISSION = "no_such_submission", 404, "no such submission"
    WORK_ID_OF_ANOTHER_FILE = "work_id_of_another_file", 422, "work id of another file"
    NOT_SUBMITTED_YET = "not_submitted_yet", 409, "not submitted yet"
    NOT_AWAITING_VERDICT = "not_awaiting_verdict", 409, "not awaiting a verdict"
    STEP_GOES_BACK = "step_goes_back", 409, "step goes back"
    TAKEN_BEYOND_ACCEPTED = "taken_beyond_accepted", 422, "taken beyond the accepted files"
    TOO_MANY_HELD = "too_many_held", 429, "too many held requests"
    UNSUBMITTED_UPLOADS = "unsubmitted_uploads", 429, "uploads not submitted on chain"
    CHAIN_UNAVAILABLE = "chain_unavailable", 503, "chain unavailable"
    BATCH_TOO_LARGE = "batch_too_large", 422, "batch too large"
    BAD_LEAF = "bad_leaf", 422, "leaf is not an uploaded file of this node"
    FILE_IN_ANOTHER_BATCH = "file_in_another_batch", 409, "file in another batch"
    BATCH_MISMATCH = "batch_mismatch", 422, "batch does not match its submission"
    BAD_BATCH_ID = "bad_batch_id", 400, "bad batch id"
    NO_SUCH_BATCH = "no_such_batch", 404, "no such batch"
    # discovery
    NODE_NOT_ON_CHAIN = "node_not_on_chain", 403, "node not on chain"
    PROVIDER_MISMATCH = "provider_mismatch", 403, "provider mismatch"
    TOO_MANY_NODES_FOR_IP = "too_many_nodes_for_ip", 429, "too many nodes for this IP address"
    NOT_OWN_ENTRY = "not_own_entry", 403, "only a node reads its own entry"
    NOT_ANNOUNCED = "not_announced", 404, "not announced"
    BAD_POOL_ID = "bad_pool_id", 400, "bad pool id"
    NOT_POOL_MANAGER = "not_pool_manager", 403, "not the pool's manager"


class ErrorBody(BaseModel):
    """The JSON body of every refusal."""

    error: str
    code: ErrorCode
    detail: str = ""


class WireError(Exception):
    """A request refused by a server: the code fixes the status and the short reason."""

    def __init__(self, code: ErrorCode, detail: str = "") -> None:
        super().__init__(f"{code.status} {code.reason}" + (f": {detail}" if detail else ""))
        self.code, self.detail = code, detail
        self.status, self.reason = code.status, code.reason

    def body(self) -> ErrorBody:
        return ErrorBody(error=self.reason, code=self.code, detail=self.detail)


_BY_CODE: dict[ErrorCode, type[WireHTTPError]] = {}


class WireHTTPError(Exception):
    """A non-2xx answer seen by the client: `status`, `code` (an `ErrorCode` when this version
    knows it, else the raw text), the server's short `reason` and its `detail`. A known code
    arrives as its subclass (`NotInPool`, `StaleWork`, ...)."""

    CODE: ClassVar[ErrorCode | None] = None

    def __init_subclass__(cls, code: ErrorCode | None = None, **kw: object) -> None:
        super().__init_subclass__(**kw)
        if code is not None:
            if not issubclass(cls, family_of(code.status)):
                raise TypeError(f"{cls.__name__} ({code.status}) must be a "
                                f"{family_of(code.status).__name__}")
            if code in _BY_CODE:
                raise TypeError(f"{code} has a class already: {_BY_CODE[code].__name__}")
            cls.CODE = code
            _BY_CODE[code] = cls

    def __init__(self, status: int, code: str, detail: str = "", reason: str = "") -> None:
        text = reason or code
        super().__init__(f"HTTP {status} {text}" + (f" [{code}]" if code and code != text else "")
                         + (f": {detail}" if detail else ""))
        self.status, self.code, self.detail, self.reason = status, code, detail, reason


# The families: what a caller may do about a refusal, decided by the type (as httpx groups its
# exceptions), never by a status number. Every code's class is in exactly one (checked above).
class Transient(WireHTTPError):
    """Worth asking again later, unchanged: the server is busy or limiting this caller (429),
    in trouble or restarting (5xx), or the body came too slowly (408)."""


class NotAuthorized(WireHTTPError):
    """The signer may not do this (401, 403): a bad or stale signature, or not (or no longer)
    a member, reader or validator; asking again as the same signer gets the same answer."""


class NotFound(WireHTTPError):
    """What was named does not exist, or no longer does (404, 410)."""


class Refused(WireHTTPError):
    """The request itself is wrong (every other 4xx): asking again as it is gets the same
    answer."""


def family_of(status: int) -> type[WireHTTPError]:
    """The family of an HTTP status (an unknown code of a newer server is placed by it)."""
    if status in (408, 429) or status >= 500:
        return Transient
    if status in (401, 403):
        return NotAuthorized
    if status in (404, 410):
        return NotFound
    return Refused


def refusal(status: int, code: str, detail: str = "", reason: str = "") -> WireHTTPError:
    """The exception of an answer: the class of its code, or its status's family for a code
    this version does not know."""
    try:
        known = ErrorCode(code)
    except ValueError:
        return family_of(status)(status, code, detail, reason)
    return _BY_CODE.get(known, family_of(status))(status, known, detail, reason)


def refusal_classes() -> dict[ErrorCode, type[WireHTTPError]]:
    """Every code's client class (a test checks each code has one)."""
    return dict(_BY_CODE)


# the signed request and the HTTP layer
class BodyTooLarge(Refused, code=ErrorCode.BODY_TOO_LARGE):
    """The body is over the route's limit."""


class BodySha256Mismatch(Refused, code=ErrorCode.BODY_SHA256_MISMATCH):
    """The body does not hash to its signed `x-content-sha256`."""


class MissingSignature(NotAuthorized, code=ErrorCode.MISSING_SIGNATURE):
    """A signature header is missing."""


class MalformedAddress(Refused, code=ErrorCode.MALFORMED_ADDRESS):
    """`x-address` is not a 0x-hex address."""


class MalformedNonce(Refused, code=ErrorCode.MALFORMED_NONCE):
    """`x-nonce` is not 8-64 characters of [0-9A-Za-z_-]."""


class MalformedTimestamp(Refused, code=ErrorCode.MALFORMED_TIMESTAMP):
    """`x-timestamp` is not decimal Unix seconds."""


class MalformedBodySha256(Refused, code=ErrorCode.MALFORMED_BODY_SHA256):
    """`x-content-sha256` is not 64 hex digits."""


class StaleTimestamp(NotAuthorized, code=ErrorCode.STALE_TIMESTAMP):
    """The request is older than the server's allowed skew."""


class FutureTimestamp(NotAuthorized, code=ErrorCode.FUTURE_TIMESTAMP):
    """The request is dated further ahead than the allowed skew."""


class BadSignature(NotAuthorized, code=ErrorCode.BAD_SIGNATURE):
    """The signature is malformed or recovers no key."""


class WrongSigner(NotAuthorized, code=ErrorCode.WRONG_SIGNER):
    """The signature is valid but of another address than `x-address`."""


class WrongAudience(NotAuthorized, code=ErrorCode.WRONG_AUDIENCE):
    """The request was signed for another service (`x-audience` is not this one's)."""


class RateLimited(Transient, code=ErrorCode.RATE_LIMITED):
    """This signer sent more requests than its rate allows: slow down."""


class IpRateLimited(Transient, code=ErrorCode.IP_RATE_LIMITED):
    """The source IP address sent more requests (or more new signers) than it may: slow down."""


class RequestTimeout(Transient, code=ErrorCode.REQUEST_TIMEOUT):
    """The body did not arrive within the server's deadline."""


class BodyIncomplete(Refused, code=ErrorCode.BODY_INCOMPLETE):
    """The body ended (the connection closed, or its framing broke) before all of it came."""


class ReplayedNonce(Refused, code=ErrorCode.REPLAYED_NONCE):
    """This (signer, nonce) was seen within its window."""


class NonceStoreUnavailable(Transient, code=ErrorCode.NONCE_STORE_UNAVAILABLE):
    """The server could not record the nonce, so it served nothing (transient)."""


class MalformedJson(Refused, code=ErrorCode.MALFORMED_JSON):
    """The body is not JSON."""


class InvalidBody(Refused, code=ErrorCode.INVALID_BODY):
    """The body is not the route's model."""


class InvalidQuery(Refused, code=ErrorCode.INVALID_QUERY):
    """The query is not the route's model."""


class NoSuchRoute(NotFound, code=ErrorCode.NO_SUCH_ROUTE):
    """No route at this path."""


class MethodNotAllowed(Refused, code=ErrorCode.METHOD_NOT_ALLOWED):
    """The path has no route for this method."""


class HttpRefused(Refused, code=ErrorCode.HTTP_REFUSED):
    """Another refusal of the HTTP layer (its status is the one aiohttp chose)."""


# the orchestrator
class NotInPool(NotAuthorized, code=ErrorCode.NOT_IN_POOL):
    """The caller is not a live member of the pool (never joined, or ejected)."""


class NotAReader(NotAuthorized, code=ErrorCode.NOT_A_READER):
    """The caller may not read the ledger, the files or the node table."""


class NotAValidator(NotAuthorized, code=ErrorCode.NOT_A_VALIDATOR):
    """The caller has no validator role on chain."""


class NoInvite(NotFound, code=ErrorCode.NO_INVITE):
    """No live invite for the caller (yet)."""


class FileTooLarge(Refused, code=ErrorCode.FILE_TOO_LARGE):
    """The file is over the pool's `max_file_bytes`."""


class TooManyWorkUnits(Refused, code=ErrorCode.TOO_MANY_WORK_UNITS):
    """The file claims more work units than the pool allows."""


class StaleWork(Refused, code=ErrorCode.STALE_WORK):
    """The file's policy version is outside what the pool accepts now."""


class FileAlreadyKnown(Refused, code=ErrorCode.FILE_ALREADY_KNOWN):
    """The file is granted and live already (or the node submitted it without a grant)."""


class BadSlotId(Refused, code=ErrorCode.BAD_SLOT_ID):
    """The slot id is not 32 lower hex digits."""


class NoSuchSlot(NotFound, code=ErrorCode.NO_SUCH_SLOT):
    """No slot with this id (never granted, or expired and dropped)."""


class SlotOfAnotherNode(NotAuthorized, code=ErrorCode.SLOT_OF_ANOTHER_NODE):
    """The slot was granted to another node."""


class SlotAlreadyUsed(Refused, code=ErrorCode.SLOT_ALREADY_USED):
    """The slot's file was uploaded already (or an upload through it is running)."""


class SlotExpired(NotFound, code=ErrorCode.SLOT_EXPIRED):
    """The slot expired before the upload."""


class CounterOutOfRange(Refused, code=ErrorCode.COUNTER_OUT_OF_RANGE):
    """A node's counters at a policy version are 0 .. files_per_step - 1."""


class CounterUsed(Refused, code=ErrorCode.COUNTER_USED):
    """The node was granted another file for this (policy version, counter): one file per
    counter."""


class FileAlreadyUploaded(Refused, code=ErrorCode.FILE_ALREADY_UPLOADED):
    """This node's file is stored already (an upload finished before a crash): submit it."""


class UploadInProgress(Refused, code=ErrorCode.UPLOAD_IN_PROGRESS):
    """An upload of this file is running (a previous connection): try again shortly."""


class NotARolloutFile(Refused, code=ErrorCode.NOT_A_ROLLOUT_FILE):
    """The uploaded bytes are not a Parquet rollout file: nothing was stored."""


class Sha256Mismatch(Refused, code=ErrorCode.SHA256_MISMATCH):
    """The uploaded bytes are not the granted file."""


class SizeMismatch(Refused, code=ErrorCode.SIZE_MISMATCH):
    """The upload is not the granted size."""


class BadFileName(Refused, code=ErrorCode.BAD_FILE_NAME):
    """A file is named by its sha256 (64 lower hex digits)."""


class NoSuchFile(NotFound, code=ErrorCode.NO_SUCH_FILE):
    """The store does not hold this file."""


class NoSuchSubmission(NotFound, code=ErrorCode.NO_SUCH_SUBMISSION):
    """The ledger has no row for the judged submission yet: post the verdict again later."""


class WorkIdOfAnotherFile(Refused, code=ErrorCode.WORK_ID_OF_ANOTHER_FILE):
    """The verdict's work id names another file than its sha256."""


class NotSubmittedYet(Refused, code=ErrorCode.NOT_SUBMITTED_YET):
    """The ledger row has not seen its submission on chain yet: post the verdict again later."""


class NotAwaitingVerdict(Refused, code=ErrorCode.NOT_AWAITING_VERDICT):
    """The row has moved on (invalidated on chain): no verdict is needed any more."""


class StepGoesBack(Refused, code=ErrorCode.STEP_GOES_BACK):
    """The pool's step only moves forward."""


class TakenBeyondAccepted(Refused, code=ErrorCode.TAKEN_BEYOND_ACCEPTED):
    """A demand's `taken_through` names an acceptance number no file has yet."""


class TooManyHeld(Transient, code=ErrorCode.TOO_MANY_HELD):
    """The caller (its address or its IP) has as many `wait=` requests held as it may: ask
    again when one is answered."""


class UnsubmittedUploads(Transient, code=ErrorCode.UNSUBMITTED_UPLOADS):
    """The node uploaded files it did not submit on chain in time: submit them first."""


class BatchTooLarge(Refused, code=ErrorCode.BATCH_TOO_LARGE):
    """The batch has more leaves than the pool's `batch.files` (or none)."""


class BadLeaf(Refused, code=ErrorCode.BAD_LEAF):
    """A leaf names a file this node did not upload, or other units, step or counter than its
    grant, or a file twice."""


class FileInAnotherBatch(Refused, code=ErrorCode.FILE_IN_ANOTHER_BATCH):
    """A leaf's file is in another batch of this node already (or submitted on its own)."""


class BatchMismatch(Refused, code=ErrorCode.BATCH_MISMATCH):
    """The leaves hash to a batch submitted on chain with another count or units."""


class BadBatchId(Refused, code=ErrorCode.BAD_BATCH_ID):
    """The batch id is not 64 lower hex digits."""


class NoSuchBatch(NotFound, code=ErrorCode.NO_SUCH_BATCH):
    """No batch with this id has had its leaves posted."""


class ChainUnavailable(Transient, code=ErrorCode.CHAIN_UNAVAILABLE):
    """The chain's RPC behind the service did not answer (transient: ask again later)."""


# discovery
class NodeNotOnChain(NotAuthorized, code=ErrorCode.NODE_NOT_ON_CHAIN):
    """The node was not added on chain by a provider."""


class ProviderMismatch(NotAuthorized, code=ErrorCode.PROVIDER_MISMATCH):
    """The announcement names another provider than the chain's."""


class TooManyNodesForIp(Transient, code=ErrorCode.TOO_MANY_NODES_FOR_IP):
    """The caller's IP address has `max_nodes_per_ip` other nodes announced."""


class NotOwnEntry(NotAuthorized, code=ErrorCode.NOT_OWN_ENTRY):
    """A node reads only its own entry."""


class NotAnnounced(NotFound, code=ErrorCode.NOT_ANNOUNCED):
    """The node has not announced itself."""


class BadPoolId(Refused, code=ErrorCode.BAD_POOL_ID):
    """The pool id is not a positive 64-bit integer in ASCII digits."""


class NotPoolManager(NotAuthorized, code=ErrorCode.NOT_POOL_MANAGER):
    """Only the pool's manager on chain lists its candidates."""


class WireUnavailable(ConnectionError):
    """The service could not be reached or dropped the connection (refused, reset, timed out):
    transient by nature, so callers that retry catch it with the other `OSError`s."""


class RolloutFileError(ValueError):
    """A rollout file that is not a valid file of this schema (corrupt, truncated, wrong types)."""
