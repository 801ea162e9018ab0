"""The on-chain protocol: Vyper contracts (stake, nodes, pools, work, rewards) and their client.

Names are imported lazily (PEP 562) so that `meshrl --help`, which imports `meshrl.protocol.cli`,
does not pay for web3 and eth-tester.
"""

from __future__ import annotations

from meshrl.lazy import lazy_getattr

_EXPORTS = {
    "Backend": "backend",
    "EthTesterBackend": "backend",
    "RpcBackend": "backend",
    "Deployment": "records",
    "NodeInfo": "records",
    "PoolInfo": "records",
    "PoolStatus": "records",
    "Protocol": "chain",
    "ProviderInfo": "records",
    "Receipt": "records",
    "SETTLE_GAS": "chain",
    "WorkInfo": "records",
    "WorkStatus": "records",
    "deploy": "chain",
    "ChainConfig": "config",
    "ProtocolParams": "config",
    "ChainError": "errors",
    "TxReverted": "errors",
    "DuplicateFile": "errors",
    "InvalidationWindowClosed": "errors",
    "InviteExpired": "errors",
    "InviteUsed": "errors",
    "NodeBlacklisted": "errors",
    "NodeNotInPool": "errors",
    "OutOfGas": "errors",
    "BadLeaf": "errors",
    "BadProof": "errors",
    "Batch": "batches",
    "Leaf": "batches",
    "batch_id": "batches",
    "WorkNotPending": "errors",
    "AlreadyVoted": "errors",
    "BondTooLow": "errors",
    "DisputeOpen": "errors",
    "DisputePeriodOver": "errors",
    "NotAccused": "errors",
    "NotBonded": "errors",
    "AlreadyChallenged": "errors",
    "UnderReview": "errors",
    "VerdictOverturned": "errors",
    "VerdictPending": "errors",
    "WorkDisputed": "errors",
    "WorkStillJudgeable": "errors",
    "DisputeInfo": "records",
    "Standing": "records",
    "Event": "events",
    "EventCursor": "events",
    "AnvilNode": "anvil",
    "invite_digest": "signing",
    "ownership_digest": "signing",
    "sign_invite": "signing",
    "sign_ownership": "signing",
    "work_id": "signing",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr("meshrl.protocol", _EXPORTS)


def __dir__() -> list[str]:
    return __all__
