"""The on-chain protocol: Vyper contracts (stake, nodes, pools, work, rewards) and their client."""

from meshrl.protocol.backend import Backend, EthTesterBackend, RpcBackend
from meshrl.protocol.chain import (
    Deployment,
    NodeInfo,
    PoolInfo,
    PoolStatus,
    Protocol,
    ProviderInfo,
    Receipt,
    WorkInfo,
    WorkStatus,
    deploy,
)
from meshrl.protocol.config import ChainConfig, ProtocolParams
from meshrl.protocol.errors import ChainError, TxReverted
from meshrl.protocol.events import Event, EventCursor
from meshrl.protocol.signing import invite_digest, ownership_digest, sign_invite, sign_ownership

__all__ = [
    "Backend",
    "ChainConfig",
    "ChainError",
    "Deployment",
    "EthTesterBackend",
    "Event",
    "EventCursor",
    "NodeInfo",
    "PoolInfo",
    "PoolStatus",
    "Protocol",
    "ProtocolParams",
    "ProviderInfo",
    "Receipt",
    "RpcBackend",
    "TxReverted",
    "WorkInfo",
    "WorkStatus",
    "deploy",
    "invite_digest",
    "ownership_digest",
    "sign_invite",
    "sign_ownership",
]
