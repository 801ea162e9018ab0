"""The pools facet (`contracts/pools.vy`): domains and pools, their managers' invites, and the
nodes that join, leave, are ejected or blacklisted. An invite names the node's generation (the
nodes facet's `node_generation`)."""

from __future__ import annotations

from meshrl.protocol.facets.base import Facet
from meshrl.protocol.records import PoolInfo, Receipt
from meshrl.protocol.signing import sign_invite

__all__ = ["DEFAULT_MAX_UNITS", "PoolsFacet"]

DEFAULT_MAX_UNITS = 1_000_000  # work units one rollout file may claim, unless a pool says else


class PoolsFacet(Facet):
    """Domains, pools, their managers and members (`pools.vy`)."""

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

    # membership
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

    # views
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
