"""Before anything is staked: is this chain the one a pool says, and are its contracts ours?

A stranger learns the chain id, the contract addresses and their code hashes from a pool's join
manifest, and its RPC URL from the same manifest. `check_contracts` holds the RPC's answers
against the manifest and the code against this package's own compiled contracts, so neither a
wrong RPC nor a pool that points at other contracts (which could take the stake) gets a token.
"""

from __future__ import annotations

from eth_utils import keccak

from meshrl.protocol.artifacts import runtime_matches
from meshrl.protocol.backend import Backend
from meshrl.protocol.errors import ChainError

__all__ = ["ContractMismatch", "check_contracts"]


class ContractMismatch(ChainError):
    """The chain or its contracts are not what they must be; `what` names which."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"{what}: {detail}")
        self.what = what


def check_contracts(backend: Backend, chain_id: int, addresses: dict[str, str],
                    code_hashes: dict[str, str]) -> None:
    """Raise `ContractMismatch` unless the chain is `chain_id` and each contract (`token`,
    `protocol`) at its address has the code hash named and is meshrl's own contract, and the
    protocol's extension (`batches`) is meshrl's too."""
    if backend.chain_id != chain_id:
        raise ContractMismatch("chain_id", f"the RPC is chain {backend.chain_id}, the pool "
                               f"says {chain_id}")
    for name in ("token", "protocol"):
        if name not in addresses or name not in code_hashes:
            raise ContractMismatch(name, "not named by the pool")
        code = bytes(backend.w3.eth.get_code(addresses[name]))  # type: ignore[arg-type]
        got = "0x" + keccak(code).hex()
        if got.lower() != code_hashes[name].lower():
            raise ContractMismatch(name, f"code at {addresses[name]} hashes to {got}, the pool "
                                   f"says {code_hashes[name]}")
        if not runtime_matches(name, code):
            raise ContractMismatch(name, f"code at {addresses[name]} is not meshrl's {name} "
                                   "contract (this version's)")
    # the protocol runs its extension on its own storage (DELEGATECALL): it must be ours too,
    # whatever the manifest says (its address is in the protocol's code, past what is compared)
    from meshrl.protocol.artifacts import load_artifact

    proto = backend.w3.eth.contract(address=addresses["protocol"],  # type: ignore[arg-type]
                                    abi=load_artifact("protocol").abi)
    ext = proto.functions.EXTENSION().call()
    if not runtime_matches("batches", bytes(backend.w3.eth.get_code(ext))):
        raise ContractMismatch("protocol", f"its extension at {ext} is not meshrl's batches "
                               "contract (this version's)")
