"""Request and response models shared by the services and their clients (pydantic, JSON).

Addresses are 0x-hex (compared case-insensitively, returned checksummed by the services);
hashes are lower-case hex without 0x. The OpenAPI documents of the services are built from
these models.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "MAX_BATCH_LEAVES",
    "MAX_REASON",
    "Accelerator",
    "BatchInfo",
    "BatchLeaf",
    "BatchPost",
    "FileStatus",
    "Hardware",
    "Health",
    "Heartbeat",
    "HeartbeatAck",
    "Invite",
    "LedgerEntry",
    "LedgerPage",
    "LedgerQuery",
    "NodeAnnouncement",
    "NodeEntry",
    "NodeList",
    "NodeState",
    "NodeStatus",
    "PoolNode",
    "PoolNodes",
    "ServiceIdentity",
    "SlotRequest",
    "StepUpdate",
    "UploadReceipt",
    "UploadSlot",
    "Verdict",
    "VerdictAck",
    "VerdictKind",
]

SHA256 = r"^[0-9a-f]{64}$"
WORK_ID = r"^([0-9a-f]{64})?$"
ADDRESS = r"^0x[0-9a-fA-F]{40}$"


# Bounds of every number a peer sends: what SQLite stores and JSON serves back unchanged
I64 = (1 << 63) - 1
MAX_HOLD_S = 30.0  # s: the longest `wait` a held request may ask for (orchestrator/hold.py)
MAX_GB = 1 << 30  # memory sizes (GB): far above any machine, far below overflow
MAX_RATE = 1e12  # tokens per second


class Model(BaseModel):
    # inf and nan cannot be stored as JSON and served back (they come back as null): refused
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ServiceIdentity(Model):
    """`GET /identity` (unsigned): which service this is and the audience requests to it are
    signed for (meshrl.wire.signing)."""

    service: str
    audience: str


class Health(Model):
    status: str = "ok"
    service: str
    info: dict[str, Any] = {}


# --- discovery -----------------------------------------------------------------------------

class Accelerator(Model):
    name: str = Field(max_length=128)
    memory_gb: float = Field(ge=0, le=MAX_GB)
    count: int = Field(1, ge=1, le=1024)


class Hardware(Model):
    cores: int = Field(ge=1, le=1 << 16)
    memory_gb: float = Field(ge=0, le=MAX_GB)
    accelerators: list[Accelerator] = Field(default_factory=list, max_length=64)


class NodeAnnouncement(Model):
    """What a node PUTs to discovery (the signer is the node)."""

    provider: str = Field(pattern=ADDRESS)
    pool_id: int = Field(ge=1, le=I64, description="the pool the node wants to join")
    endpoints: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list,
                                                                   max_length=16)
    hardware: Hardware
    software: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=256)]] = (
        Field(default_factory=dict, max_length=32))


class NodeStatus(StrEnum):
    PENDING = "pending"  # announced; on chain, not in a pool
    IN_POOL = "in_pool"
    EJECTED = "ejected"
    BLACKLISTED = "blacklisted"


class NodeEntry(Model):
    address: str
    info: NodeAnnouncement
    status: NodeStatus
    chain_pool: int = 0
    ip: str = ""
    updated_at: float


class NodeList(Model):
    nodes: list[NodeEntry]


# --- orchestrator --------------------------------------------------------------------------

class Invite(Model):
    """A pool manager's one-time invite: the node calls `join_pool` with it on chain."""

    pool_id: int
    domain_id: int
    node: str
    nonce: int
    expiry: int
    signature: str = Field(description="0x-hex, 65 bytes (meshrl.protocol.signing.sign_invite)")


class Heartbeat(Model):
    policy_version: int = Field(-1, ge=-1, le=I64, description="loaded policy version (-1: none)")
    step: int = Field(0, ge=0, le=I64)
    tokens_per_s: float = Field(0.0, ge=0, le=MAX_RATE)
    files_pending: int = Field(0, ge=0, le=I64)


class NodeState(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # one heartbeat missed
    DEAD = "dead"  # K missed: ejection on chain pending
    EJECTED = "ejected"  # must be invited again


class HeartbeatAck(Model):
    state: NodeState
    interval_s: float
    step: int = Field(description="the pool's current step")


class SlotRequest(Model):
    sha256: str = Field(pattern=SHA256)
    size: int = Field(ge=1, le=I64)
    policy_version: int = Field(ge=0, le=I64, description="the version that generated the file "
                                "(one of the work order's `policy_versions`)")
    work_units: int = Field(ge=1, le=I64)
    counter: int = Field(ge=0, lt=1 << 16, description="the file's counter at its version "
                         "(0 .. files_per_step - 1); the orchestrator grants one file each")


class UploadSlot(Model):
    """Where and until when to upload one file (single use)."""

    slot_id: str
    method: str = "PUT"
    url: str = Field(description="path on the orchestrator (disk store) or a pre-signed URL")
    signed: bool = Field(True, description="sign the upload like any request (disk store)")
    expires_at: float
    sha256: str
    size: int


class UploadReceipt(Model):
    sha256: str
    size: int
    status: str


class FileStatus(StrEnum):
    GRANTED = "granted"
    UPLOADED = "uploaded"
    SUBMITTED = "submitted"
    ACCEPTED = "accepted"
    SOFT_INVALIDATED = "soft_invalidated"
    HARD_INVALIDATED = "hard_invalidated"
    EXPIRED = "expired"


class VerdictKind(StrEnum):
    ACCEPT = "accept"
    SOFT_INVALID = "soft_invalid"
    HARD_INVALID = "hard_invalid"


MAX_REASON = 500  # characters of a verdict's reason, on the wire and in the ledger


class Verdict(Model):
    sha256: str = Field(pattern=SHA256)
    verdict: VerdictKind
    reason: str = Field("", max_length=MAX_REASON)
    work_id: str = Field("", pattern=WORK_ID, description="the submission judged (the chain's "
                         "work id, hex); empty: the file's granted row")


class BatchLeaf(Model):
    """One file of a node's batch, as its Merkle leaf names it (meshrl.protocol.batches)."""

    sha256: str = Field(pattern=SHA256)
    work_units: int = Field(ge=1, le=I64)
    step: int = Field(ge=0, le=I64, description="the file's policy version (the leaf's "
                      "uint256 `step` slot, docs/protocol.md)")
    counter: int = Field(ge=0, lt=1 << 16)


MAX_BATCH_LEAVES = 256  # the most files a pool's batch rule allows (pool.BatchRule.files)


class BatchPost(Model):
    """A node's batch of uploaded files, in leaf order: posted before it is submitted on chain
    (`submit_batch` commits to the root of these leaves), so validators can open its leaves."""

    leaves: list[BatchLeaf] = Field(min_length=1, max_length=MAX_BATCH_LEAVES)


class BatchInfo(Model):
    """A batch's leaves as posted by its node (`GET /batches/{batch_id}`); a reader recomputes
    the root and the id from them and checks both against the chain."""

    batch_id: str = Field(pattern=SHA256)
    node: str
    root: str = Field(pattern=SHA256)
    leaves: list[BatchLeaf] = Field(max_length=MAX_BATCH_LEAVES)
    submitted: bool = Field(False, description="the orchestrator has seen its BatchSubmitted")


class VerdictAck(Model):
    sha256: str
    status: FileStatus
    work_id: str = ""


class LedgerEntry(Model):
    """One submission (or grant) of a file by one node. A file has at most one granted row; a
    node that submits on chain a file it was not granted gets a row of its own (`granted`
    false), which is judged like any other and never trained on."""

    seq: int = Field(description="ledger order (grant or submission order); pages follow it")
    sha256: str
    node: str
    provider: str
    policy_version: int = Field(description="the version that generated the file (-1: a "
                                "submission of a file the pool never stored)")
    work_units: int
    size: int
    counter: int = Field(-1, description="the granted counter at its version (-1: a "
                         "submission without grant)")
    status: FileStatus
    verdict: VerdictKind | None = Field(None, description="the verdict posted on it (None: "
                                        "no validator has judged it)")
    verdict_reason: str = Field("", max_length=MAX_REASON, description="that verdict's "
                                "reason (empty for an accept)")
    download: str = Field("", description="signed GET path of the file (empty until uploaded)")
    work_id: str = Field("", description="the chain's work id (hex), once submitted")
    granted: bool = Field(True, description="an upload slot for this file was granted to `node`")
    uploaded: bool = Field(False, description="`node` uploaded the file through its slot")
    accepted_seq: int = Field(0, description="acceptance order (0: never accepted)")
    batch_id: str = Field("", description="the batch (hex id) the file was submitted in; "
                          "empty: submitted on its own")


class StepUpdate(Model):
    """The trainer moves the pool to `step` (monotone) and, optionally, says what it will take
    (the orchestrator's pacing, docs/services.md): it has taken every accepted file up to
    acceptance number `taken_through`, and wants `ahead` files in flight or waiting beyond
    those. Without `ahead` the pool is not paced (each node makes its counters' worth)."""

    step: int = Field(ge=0, le=I64)
    taken_through: int | None = Field(None, ge=0, le=I64, description="the `accepted_seq` of "
                                      "the last accepted file the trainer has taken")
    ahead: int | None = Field(None, ge=0, le=1 << 20, description="files the trainer wants "
                              "generated, judged or waiting beyond those it has taken (None: "
                              "no pacing)")


class PoolNode(Model):
    address: str
    provider: str
    state: NodeState
    last_seen: float
    policy_version: int
    step: int
    tokens_per_s: float
    files_pending: int
    # what the chain says (token base units), kept by the orchestrator from its events
    stake: int = Field(0, description="the node's provider's current stake")
    slashed: int = Field(0, description="slashed from its provider for this node's "
                         "hard-invalidated work")
    rewards_earned: int = Field(0, description="rewards of its valid work (claimed, or "
                                "submitted and not wiped)")
    rewards_claimed: int = Field(0, description="rewards of its work claimed by its provider")
    rewards_claimable: int = Field(0, description="valid, unlocked, unclaimed, not wiped at "
                                   "the latest block seen")


class PoolNodes(Model):
    nodes: list[PoolNode]


class LedgerQuery(Model):
    policy_version: int | None = Field(None, ge=0, le=I64, description="only files of this "
                                       "policy version")
    status: FileStatus | None = Field(None, description="only files in this state")
    sha256: str | None = Field(None, pattern=SHA256, description="only this file")
    work_id: str | None = Field(None, pattern=SHA256,
                                description="only this submission")
    after: int = Field(0, ge=0, le=I64, description="ledger sequence to start after (paging)")
    accepted_after: int | None = Field(None, ge=0, le=I64, description="accepted files in "
                                       "acceptance order, after this `accepted_seq` (the "
                                       "trainer's feed; `next_after` is then an `accepted_seq`)")
    limit: int = Field(500, ge=1, le=5000)
    wait: float = Field(0.0, ge=0, le=MAX_HOLD_S, allow_inf_nan=False, description="seconds "
                        "the answer may wait for a first entry (0: answer at once)")


class LedgerPage(Model):
    entries: list[LedgerEntry]
    next_after: int = Field(description="pass as `after` for the next page")
