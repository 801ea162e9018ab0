"""The on-chain protocol: Vyper contracts (stake, nodes, pools, work, rewards) and their client.

Names are imported lazily (PEP 562) so that `meshrl --help`, which imports `meshrl.protocol.cli`,
does not pay for web3 and eth-tester.
"""

from __future__ import annotations

import importlib
from typing import Any

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
    "WorkInfo": "records",
    "WorkStatus": "records",
    "deploy": "chain",
    "ChainConfig": "config",
    "ProtocolParams": "config",
    "ChainError": "errors",
    "TxReverted": "errors",
    "Event": "events",
    "EventCursor": "events",
    "AnvilNode": "anvil",
    "invite_digest": "signing",
    "ownership_digest": "signing",
    "sign_invite": "signing",
    "sign_ownership": "signing",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'meshrl.protocol' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"meshrl.protocol.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
