# pragma version ~=0.4.3
# pragma optimize codesize
# pragma experimental-codegen
"""
@title meshrl protocol
@notice One contract composed of the roles, stake, nodes, pools and work modules.
@dev The stake/reward token is a separate ERC-20 (token.vy); this contract must be one of
     its minters so claimed rewards can be minted, and (for the treasury functions) its owner.
"""

from ethereum.ercs import IERC20
from . import roles
from . import stake
from . import nodes
from . import pools
from . import work
from . import treasury

initializes: roles
initializes: stake[roles := roles]
initializes: nodes[stake := stake]
initializes: pools[roles := roles, nodes := nodes, stake := stake]
initializes: work[roles := roles, stake := stake, nodes := nodes, pools := pools]
initializes: treasury[roles := roles, stake := stake]

exports: (
    roles.__interface__,
    stake.__interface__,
    nodes.__interface__,
    pools.__interface__,
    work.__interface__,
    treasury.__interface__,
)


# The batches extension (batches.vy): functions this contract has no room for (EIP-170),
# run on this contract's storage by DELEGATECALL.
EXTENSION: public(immutable(address))


@deploy
def __init__(
    extension: address,
    token: IERC20,
    min_stake: uint256,
    stake_per_unit: uint256,
    unbonding_delay: uint256,
    invalidation_window: uint256,
    lock_period: uint256,
    slash_penalty: uint256,
    verdict_bond: uint256,
    dispute_period: uint256,
    vote_period: uint256,
    quorum: uint256,
):
    EXTENSION = extension
    roles.__init__()
    stake.__init__(token, min_stake, stake_per_unit, unbonding_delay)
    work.__init__(invalidation_window, lock_period, slash_penalty)
    work._set_dispute_params(verdict_bond, dispute_period, vote_period, quorum, True)


@external
def __default__() -> bytes32:
    """
    @notice Any other function is the batches extension's (`submit_batch`, `open_leaf`): run
            on this contract's storage, its revert or its bytes32 result passed on.
    @return What the extension returned.
    """
    return extract32(raw_call(EXTENSION, msg.data, max_outsize=32, is_delegate_call=True), 0)
