"""The chain client's facets: one mixin per Vyper module of the protocol, composed into
`meshrl.protocol.chain.Protocol` (callers use that class, never a facet alone).

- `base.Facet`: the state every facet shares, the signer, `_send` / `_view`, `events`;
- `token.TokenFacet` (`token.vy`, its own contract): balances, transfers, allowances, gas money;
- `treasury.TreasuryFacet` (`treasury.vy`): minting, minters, stray tokens, accepting a
  federator hand-over;
- `roles.RolesFacet` (`roles.vy`): the federator, its proposed successor, validators;
- `stake.StakeFacet` (`stake.vy`): providers' stake, validators' bonds, slashing, totals;
- `nodes.NodesFacet` (`nodes.vy`): nodes and their ownership proofs;
- `pools.PoolsFacet` (`pools.vy`): domains, pools, invites, membership;
- `work.WorkFacet` (`work.vy`): work items, verdicts, disputes, claims;
- `batches.BatchesFacet` (`batches.vy`, the protocol's extension): batches committed by a
  Merkle root, and the leaves taken out of them.

`sig.vy` has no functions of its own to call: `meshrl.protocol.signing` is its Python side.
A facet may call another's method (staking approves through the token facet's
`increase_allowance`, an invite reads the nodes facet's `node_generation`): they all live on the
one `Protocol` object.
"""
