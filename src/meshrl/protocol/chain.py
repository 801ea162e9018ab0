# over 400 lines: the typed client of every contract function and event, mirroring the Vyper modules
#  in one class
"""The typed Python client of the protocol contracts: deploy the set, act as any role, read
state and events. Every transaction is signed locally; every revert raises `TxReverted`."""

from __future__ import annotations

from typing import Any

from eth_account.signers.local import LocalAccount

from meshrl.protocol.artifacts import load_artifact
from meshrl.protocol.backend import Backend
from meshrl.protocol.batches import Batch, Leaf, batch_id
from meshrl.protocol.config import ProtocolParams
from meshrl.protocol.errors import TxReverted
from meshrl.protocol.events import EventCursor, EventDecoder
from meshrl.protocol.records import (
    Deployment,
    DisputeInfo,
    NodeInfo,
    PoolInfo,
    ProviderInfo,
    Receipt,
    WorkInfo,
)
from meshrl.protocol.signing import sign_invite, sign_ownership, work_id

__all__ = ["DEFAULT_MAX_UNITS", "SETTLE_GAS", "Protocol", "deploy", "protocol_abi"]

DEFAULT_MAX_UNITS = 1_000_000  # work units one rollout file may claim, unless a pool says else


def _deploy_one(backend: Backend, account: LocalAccount, name: str, *args: Any) -> Any:
    art = load_artifact(name)
    factory = backend.w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
    receipt = backend.send(account, {"data": factory.constructor(*args).data_in_transaction})
    return receipt["contractAddress"], receipt["blockNumber"]


def deploy(
    backend: Backend,
    federator: LocalAccount,
    params: ProtocolParams | None = None,
    token: str | None = None,
) -> Deployment:
    """Deploy token + protocol with `federator` as admin. The new token's minting right and
    ownership go to the protocol (the federator keeps none of its own: it acts through the
    protocol, so handing over the federator role hands over the token too).

    With `token`, use that existing ERC-20 instead (it must let the protocol mint rewards).
    """
    p = params or ProtocolParams()
    own_token = token is None
    if token is None:
        token, block = _deploy_one(backend, federator, "token", p.token_name, p.token_symbol)
    else:
        block = backend.block_number()
    extension, _ = _deploy_one(backend, federator, "batches")
    protocol, _ = _deploy_one(
        backend,
        federator,
        "protocol",
        extension,
        token,
        p.min_stake,
        p.stake_per_unit,
        p.unbonding_delay,
        p.invalidation_window,
        p.lock_period,
        p.slash_penalty,
        p.verdict_bond,
        p.dispute_period,
        p.vote_period,
        p.quorum,
    )
    dep = Deployment(backend.chain_id, token, protocol, federator.address, block)
    if own_token:
        c = Protocol(backend, dep, federator)
        t = c.token.functions
        c._send(t.set_minter(protocol, True))
        c._send(t.set_minter(federator.address, False))
        c._send(t.transfer_ownership(protocol))
    return dep


def protocol_abi() -> list[dict[str, Any]]:
    """The protocol's ABI with its extension's functions and events (`batches.vy`: run by the
    protocol's fallback on its storage, so called and logged at the protocol's address)."""
    ext = [e for e in load_artifact("batches").abi if e["type"] in ("function", "event")]
    return [e for e in load_artifact("protocol").abi if e["type"] != "fallback"] + ext


# settle: an upheld hard verdict's slash, wipe and review, and each voter's stake (at most 8)
# (benchmarks/README.md)
SETTLE_GAS = 500_000


class Protocol:
    """All protocol actions, signed by `account`. `as_(other)` acts as another account."""

    def __init__(
        self, backend: Backend, deployment: Deployment, account: LocalAccount | None = None
    ):
        if deployment.chain_id != backend.chain_id:
            raise ValueError(
                f"deployment is for chain {deployment.chain_id}, "
                f"backend is chain {backend.chain_id}"
            )
        self.backend = backend
        self.deployment = deployment
        self.account = account
        w3 = backend.w3
        self.token = w3.eth.contract(address=deployment.token, abi=load_artifact("token").abi)
        self.contract = w3.eth.contract(address=deployment.protocol, abi=protocol_abi())
        self.decoder = EventDecoder(backend, [self.token, self.contract])

    def as_(self, account: LocalAccount) -> Protocol:
        other = Protocol.__new__(Protocol)
        other.__dict__.update(self.__dict__)
        other.account = account
        return other

    def _signer(self) -> LocalAccount:
        if self.account is None:
            raise ValueError("this client has no signing account")
        return self.account

    @property
    def address(self) -> str:
        return self._signer().address

    # plumbing
    def _send(self, fn: Any, gas: int | None = None) -> Receipt:
        tx: dict[str, Any] = {"to": fn.address, "data": fn._encode_transaction_data()}
        if gas is not None:
            tx["gas"] = gas
        r = self.backend.send(self._signer(), tx)
        return Receipt(
            "0x" + bytes(r["transactionHash"]).hex(),
            int(r["blockNumber"]),
            int(r["gasUsed"]),
            self.decoder.decode_receipt(r),
        )

    def _view(self, fn: Any) -> Any:
        sender = self.account.address if self.account else self.deployment.federator
        return self.backend.call(fn, sender)

    def events(self, from_block: int | None = None) -> EventCursor:
        """A cursor over token + protocol events, from the deployment block by default."""
        start = self.deployment.block if from_block is None else from_block
        return EventCursor(
            self.backend, self.decoder, [self.token.address, self.contract.address], start
        )

    # token
    def balance(self, who: str | None = None) -> int:
        return self._view(self.token.functions.balanceOf(who or self.address))

    def send_ether(self, to: str, wei: int) -> str:
        """Send `wei` of the chain's native currency (gas money) to `to`; the tx hash."""
        r = self.backend.send(self._signer(), {"to": to, "value": wei, "gas": 21_000})
        return "0x" + bytes(r["transactionHash"]).hex()

    def transfer(self, to: str, amount: int, gas: int | None = None) -> Receipt:
        return self._send(self.token.functions.transfer(to, amount), gas)

    def approve(self, spender: str, amount: int) -> Receipt:
        """Set an allowance outright. Racy when changing one non-zero value to another (a
        spender that front-runs the change spends both): change a live allowance with
        `increase_allowance` / `decrease_allowance`, as this client does itself."""
        return self._send(self.token.functions.approve(spender, amount))

    def increase_allowance(self, spender: str, added: int) -> Receipt:
        return self._send(self.token.functions.increaseAllowance(spender, added))

    def decrease_allowance(self, spender: str, subtracted: int) -> Receipt:
        """Lower an allowance; reverts if the spender already used more than would be left."""
        return self._send(self.token.functions.decreaseAllowance(spender, subtracted))

    def allowance(self, owner: str, spender: str) -> int:
        return self._view(self.token.functions.allowance(owner, spender))

    # treasury (the token's powers, held by the protocol, used by the federator)
    def mint(self, to: str, amount: int) -> Receipt:
        return self._send(self.contract.functions.mint(to, amount))

    def set_minter(self, minter: str, enabled: bool) -> Receipt:
        return self._send(self.contract.functions.set_minter(minter, enabled))

    def recover_tokens(self, receiver: str) -> Receipt:
        """Send stake tokens transferred to the protocol by mistake (not staked) to `receiver`."""
        return self._send(self.contract.functions.recover_tokens(receiver))

    # roles
    def set_validator(self, validator: str, enabled: bool = True) -> Receipt:
        return self._send(self.contract.functions.set_validator(validator, enabled))

    def propose_federator(self, federator: str) -> Receipt:
        """First step of a hand-over (the zero address cancels); nothing moves yet."""
        return self._send(self.contract.functions.propose_federator(federator))

    def accept_federator(self, keep_grants: bool = False) -> Receipt:
        """Second step, by the proposed account: it takes every federator power. By default
        every role of the outgoing tenure is revoked (`handover_roles` lists them first:
        validators, pool managers, minters); `keep_grants` keeps them but still strips the
        outgoing key of its own validator and minting rights."""
        return self._send(self.contract.functions.accept_federator(keep_grants))

    def handover_roles(self) -> dict[str, list]:
        """The roles a hand-over now would revoke by default: validators and pool managers
        granted in the current federator's tenure, the minters appointed through the protocol,
        and which of them the federator key holds itself."""
        f = self.contract.functions
        fed = self.federator()
        named = {e.args["validator"] for e in self.events().poll() if e.name == "ValidatorSet"}
        validators = sorted(v for v in named if self.is_validator(v))
        managers = []
        for pool in range(1, self._view(f.pool_count()) + 1):
            manager = self._view(f.pool_manager(pool))
            if int(manager, 16):
                managers.append((pool, manager))
        minters = list(self._view(f.granted_minters()))
        held = sorted({a for a in [*validators, *minters, *(m for _, m in managers)] if a == fed})
        return {"validators": validators, "pool_managers": managers, "minters": minters,
                "held_by_federator": held}

    def granted_minters(self) -> list[str]:
        return list(self._view(self.contract.functions.granted_minters()))

    def pending_federator(self) -> str:
        return self._view(self.contract.functions.pending_federator())

    def is_validator(self, who: str) -> bool:
        return self._view(self.contract.functions.validators(who))

    def federator(self) -> str:
        return self._view(self.contract.functions.federator())

    # stake
    def register_provider(self, amount: int, approve: bool = True) -> Receipt:
        """Register with `amount` of stake; `approve` raises the protocol's allowance by it
        first (`increaseAllowance`: an allowance still in use is never overwritten)."""
        if approve:
            self.increase_allowance(self.contract.address, amount)
        return self._send(self.contract.functions.register_provider(amount))

    def add_stake(self, amount: int, approve: bool = True) -> Receipt:
        if approve:
            self.increase_allowance(self.contract.address, amount)
        return self._send(self.contract.functions.add_stake(amount))

    def request_unstake(self, amount: int) -> Receipt:
        return self._send(self.contract.functions.request_unstake(amount))

    def withdraw(self, gas: int | None = None) -> Receipt:
        return self._send(self.contract.functions.withdraw(), gas)

    # validator bonds
    def post_bond(self, amount: int, approve: bool = True) -> Receipt:
        """Add to this validator's bond (a verdict locks `verdict_bond` of it until settled)."""
        if approve:
            self.increase_allowance(self.contract.address, amount)
        return self._send(self.contract.functions.post_bond(amount))

    def withdraw_bond(self, amount: int) -> Receipt:
        return self._send(self.contract.functions.withdraw_bond(amount))

    def bond(self, who: str | None = None) -> tuple[int, int]:
        """(bond, locked by open verdicts) of a validator."""
        f, who = self.contract.functions, who or self.address
        return self._view(f.bonds(who)), self._view(f.bond_locked(who))

    def slash(self, provider: str, amount: int) -> Receipt:
        return self._send(self.contract.functions.slash(provider, amount))

    def collect_slashed(self, receiver: str) -> Receipt:
        return self._send(self.contract.functions.collect_slashed(receiver))

    def set_stake_params(
        self, min_stake: int, stake_per_unit: int, unbonding_delay: int
    ) -> Receipt:
        fn = self.contract.functions.set_stake_params(min_stake, stake_per_unit, unbonding_delay)
        return self._send(fn)

    def provider(self, who: str | None = None) -> ProviderInfo:
        return ProviderInfo(*self._view(self.contract.functions.providers(who or self.address)))

    def required_stake(self, who: str | None = None) -> int:
        return self._view(self.contract.functions.required_stake(who or self.address))

    def open_verdicts(self, provider: str | None = None) -> int:
        """Hard verdicts against `provider`'s work still disputable (neither settled nor
        overturned yet)."""
        return self._view(self.contract.functions.open_verdicts(provider or self.address))

    def totals(self) -> dict[str, int]:
        f = self.contract.functions
        return {
            "stake": self._view(f.total_stake()),
            "unbonding": self._view(f.total_unbonding()),
            "slashed": self._view(f.total_slashed()),
            "claimed": self._view(f.total_claimed()),
            "bonds": self._view(f.total_bonds()),
            "deposits": self._view(f.total_deposits()),
        }

    # nodes
    def add_node(
        self, node_key: LocalAccount, compute_units: int, signature: bytes | None = None
    ) -> Receipt:
        """Add a node, signing the ownership proof with its key unless `signature` is given."""
        if signature is None:
            signature = sign_ownership(
                node_key.key,
                self.contract.address,
                self.backend.chain_id,
                self.address,
                self.node_generation(node_key.address),
            )
        return self._send(
            self.contract.functions.add_node(node_key.address, compute_units, signature)
        )

    def remove_node(self, node: str) -> Receipt:
        return self._send(self.contract.functions.remove_node(node))

    def node(self, node: str) -> NodeInfo:
        return NodeInfo(*self._view(self.contract.functions.node_info(node)))

    def nodes(self, nodes: list[str]) -> list[NodeInfo]:
        """`node` of each, in batched reads (`Backend.call_many`)."""
        f = self.contract.functions
        return [NodeInfo(*r) for r in self.backend.call_many([f.node_info(n) for n in nodes])]

    def node_generation(self, node: str) -> int:
        """The generation ownership proofs and invites for `node` must name now."""
        return self._view(self.contract.functions.node_generation(node))

    # pools
    def create_domain(self, name: str) -> int:
        return (
            self._send(self.contract.functions.create_domain(name))
            .event("DomainCreated")
            .args["domain"]
        )

    def find_domain(self, name: str) -> int | None:
        """The id of the first domain called `name`, or None (reads views, no log scan)."""
        f = self.contract.functions
        for domain in range(1, self._view(f.domain_count()) + 1):
            if self._view(f.domain_names(domain)) == name:
                return domain
        return None

    def create_pool(
        self, domain: int, manager: str, reward_rate: int, max_units: int = DEFAULT_MAX_UNITS
    ) -> int:
        """A pending pool whose files may claim at most `max_units` work units each."""
        fn = self.contract.functions.create_pool(domain, manager, reward_rate, max_units)
        return self._send(fn).event("PoolCreated").args["pool"]

    def set_pool_manager(self, pool: int, manager: str) -> Receipt:
        """Replace a pool's manager key (federator); the old key's invites stop working."""
        return self._send(self.contract.functions.set_pool_manager(pool, manager))

    def set_pool_limits(self, pool: int, max_units: int, min_interval: int = 0) -> Receipt:
        """Units per file, and seconds between two submissions of a node (manager/federator)."""
        return self._send(self.contract.functions.set_pool_limits(pool, max_units, min_interval))

    def start_pool(self, pool: int) -> Receipt:
        return self._send(self.contract.functions.start_pool(pool))

    def complete_pool(self, pool: int) -> Receipt:
        return self._send(self.contract.functions.complete_pool(pool))

    def set_reward_rate(self, pool: int, rate: int) -> Receipt:
        return self._send(self.contract.functions.set_reward_rate(pool, rate))

    def sign_invite(self, pool: int, node: str, nonce: int, expiry: int) -> bytes:
        """An invite for `node` in its current generation, signed by this client's account
        (the pool manager). `expiry` may be at most a day after the join."""
        info = self.pool(pool)
        return sign_invite(
            self._signer().key,
            self.contract.address,
            self.backend.chain_id,
            info.domain,
            pool,
            node,
            self.node_generation(node),
            nonce,
            expiry,
        )

    def join_pool(self, pool: int, node: str, nonce: int, expiry: int, signature: bytes) -> Receipt:
        return self._send(self.contract.functions.join_pool(pool, node, nonce, expiry, signature))

    def leave_pool(self, node: str) -> Receipt:
        return self._send(self.contract.functions.leave_pool(node))

    def eject_node(self, pool: int, node: str) -> Receipt:
        return self._send(self.contract.functions.eject_node(pool, node))

    def blacklist_node(self, pool: int, node: str) -> Receipt:
        return self._send(self.contract.functions.blacklist_node(pool, node))

    def pool_manager(self, pool: int) -> str:
        """The key managing `pool` now (the zero address once a hand-over revoked it)."""
        return self._view(self.contract.functions.pool_manager(pool))

    def pool(self, pool: int) -> PoolInfo:
        return PoolInfo(*self._view(self.contract.functions.pool_info(pool)))

    def is_blacklisted(self, pool: int, node: str) -> bool:
        return self._view(self.contract.functions.blacklisted(pool, node))

    def blacklisted_many(self, pairs: list[tuple[int, str]]) -> list[bool]:
        """`is_blacklisted` of each (pool, node), in batched reads."""
        f = self.contract.functions
        return [bool(b) for b in self.backend.call_many([f.blacklisted(p, n) for p, n in pairs])]

    # work and rewards: items are keyed by work id = keccak256(abi_encode(node, file sha256))
    @staticmethod
    def work_id(node: str, file_sha256: bytes) -> bytes:
        return work_id(node, file_sha256)

    def submit_work(self, pool: int, node: str, file_sha256: bytes, units: int) -> Receipt:
        """Submit a file's work; the `WorkSubmitted` event carries its `work_id`."""
        return self._send(self.contract.functions.submit_work(pool, node, file_sha256, units))

    def hard_invalidate(self, work_id: bytes) -> Receipt:
        """Accuse work of fraud (final at once when the dispute period is 0, else after it:
        `settle`)."""
        return self._send(self.contract.functions.hard_invalidate(work_id))

    def soft_invalidate(self, work_id: bytes) -> Receipt:
        return self._send(self.contract.functions.soft_invalidate(work_id))

    def challenge(self, work_id: bytes) -> Receipt:
        """The accused provider disputes the verdict on its work, once, paying a deposit of
        `DisputeInfo.stake` from its stake (refunded if the verdict is overturned)."""
        return self._send(self.contract.functions.challenge(work_id))

    def vote(self, work_id: bytes, uphold: bool) -> Receipt:
        """Another validator re-judges a verdict (an overturn vote also challenges it); the
        vote locks `DisputeInfo.stake` of its bond, lost if it is on the losing side."""
        return self._send(self.contract.functions.vote(work_id, uphold))

    def rule(self, work_id: bytes, uphold: bool) -> Receipt:
        """The federator decides a challenged verdict (its vote is a ruling)."""
        return self._send(self.contract.functions.vote(work_id, uphold))

    def voters(self, work_id: bytes) -> list[str]:
        """The validators who voted on the verdict on `work_id`, in order."""
        f, out = self.contract.functions, []
        for i in range(8):  # work.vy's MAX_VOTERS
            try:
                out.append(self._view(f.voters(work_id, i)))
            except TxReverted:  # past the end: the getter reverts
                break
        return out

    def review_until(self, provider: str | None = None) -> int:
        """Until when `provider`'s unclaimed work may be re-judged and its claims wait (set
        by an upheld hard verdict against it)."""
        return self._view(self.contract.functions.review_until(provider or self.address))

    def settle(self, work_id: bytes, gas: int | None = None) -> Receipt:
        """Make a verdict final once its dispute period is over (anyone). `gas` skips the
        estimate, which a node runs at its latest block: on a chain that mines only with
        transactions (anvil) that block can be older than the period's end while the next one
        is not (`SETTLE_GAS` covers an upheld hard verdict's slash and wipe)."""
        return self._send(self.contract.functions.settle(work_id), gas)

    def dispute(self, work_id: bytes) -> DisputeInfo:
        return DisputeInfo(*self._view(self.contract.functions.disputes(work_id)))

    def standing(self, work_id: bytes) -> int:
        """`Standing.CLEAR`, `WIPED` (an upheld verdict on its node reached it) or `DISPUTED`."""
        return self._view(self.contract.functions.standing(work_id))

    def set_dispute_params(
        self, verdict_bond: int, dispute_period: int, vote_period: int, quorum: int
    ) -> Receipt:
        fn = self.contract.functions.set_dispute_params(
            verdict_bond, dispute_period, vote_period, quorum
        )
        return self._send(fn)

    def claim(self, work_ids: list[bytes], gas: int | None = None) -> Receipt:
        return self._send(self.contract.functions.claim(list(work_ids)), gas)

    # batches (issue 46; contracts/batches.vy, meshrl.protocol.batches): a batch is a work
    # item keyed by its batch id, so `claim`, `hard_invalidate`, `standing`, `work` take it too
    @staticmethod
    def batch_id(node: str, root: bytes) -> bytes:
        return batch_id(node, root)

    def submit_batch(
        self, pool: int, node: str, root: bytes, count: int, units: int, gas: int | None = None
    ) -> Receipt:
        """Commit `count` files of `node` by their Merkle root and total units; the
        `BatchSubmitted` event carries its `batch_id`."""
        return self._send(
            self.contract.functions.submit_batch(pool, node, root, count, units), gas
        )

    def submit_leaves(self, pool: int, leaves: list[Leaf]) -> tuple[Batch, Receipt]:
        """Build the batch of `leaves` (one node's files) and submit it."""
        batch = Batch.of(leaves)
        return batch, self.submit_batch(pool, batch.node, batch.root, batch.count, batch.units)

    def open_leaf(
        self,
        root: bytes,
        index: int,
        leaf: Leaf,
        proof: list[bytes],
        verdict: int = 0,
        gas: int | None = None,
    ) -> Receipt:
        """Take leaf `index` out of the batch of (`leaf.node`, `root`) with its proof (a
        validator, within the batch's window): it becomes the work item `leaf.work_id`, and
        `verdict` (`WorkStatus.SOFT_INVALIDATED` / `HARD_INVALIDATED`, 0 none) accuses it in
        the same transaction. A file that already has an item is void in the batch instead,
        and the verdict accuses the batch (`LeafOpened.copy`)."""
        fn = self.contract.functions.open_leaf(
            leaf.node, root, index, leaf.file_sha256, leaf.units, leaf.step, leaf.counter,
            list(proof), verdict,
        )
        return self._send(fn, gas)

    def accuse_leaf(self, batch: Batch, index: int, hard: bool) -> Receipt:
        """A verdict on one file of `batch`: open it with its proof and accuse it."""
        return self.open_leaf(batch.root, index, batch.leaves[index], batch.proof(index),
                              3 if hard else 2)

    def claim_batch(self, batch_ids: list[bytes], gas: int | None = None) -> Receipt:
        """Claim batches (and any items) at once: one item per batch, whatever its size."""
        return self.claim(batch_ids, gas)

    def set_work_params(self, invalidation_window: int, lock_period: int, penalty: int) -> Receipt:
        fn = self.contract.functions.set_work_params(invalidation_window, lock_period, penalty)
        return self._send(fn)

    def work(self, work_id: bytes) -> WorkInfo:
        return WorkInfo(*self._view(self.contract.functions.work_info(work_id)))

    def works(self, work_ids: list[bytes]) -> list[WorkInfo]:
        """`work` of each, in batched reads (`Backend.call_many`)."""
        f = self.contract.functions
        return [WorkInfo(*r) for r in self.backend.call_many([f.work_info(w) for w in work_ids])]

    def claimable(self, work_id: bytes) -> bool:
        return self._view(self.contract.functions.claimable(work_id))

    def last_submission(self, node: str) -> int:
        """When `node` last submitted in a pool with a submission interval (0: never)."""
        return self._view(self.contract.functions.last_submission(node))
