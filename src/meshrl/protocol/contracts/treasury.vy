# pragma version ~=0.4.3
"""
@title Treasury
@notice The token's powers, held by the protocol contract and exercised by the federator, so
        that handing over the federator role hands them over too: minting, appointing minters
        (the protocol's own minting right cannot be revoked), and recovering stake tokens sent
        to the protocol by mistake.
@dev Needs the protocol to own the token (`deploy` transfers ownership); with an external
     token whose owner is elsewhere, `set_minter` reverts in the token.
"""

from . import roles
from . import stake

uses: roles
uses: stake

interface Token:
    def mint(receiver: address, amount: uint256): nonpayable
    def set_minter(minter: address, enabled: bool): nonpayable
    def balanceOf(owner: address) -> uint256: view
    def transfer(receiver: address, amount: uint256) -> bool: nonpayable

event TokensRecovered:
    receiver: indexed(address)
    amount: uint256


@external
@nonreentrant
def mint(receiver: address, amount: uint256):
    """
    @notice Mint `amount` tokens to `receiver`.
    @dev Federator only.
    @param receiver The recipient.
    @param amount The amount in base units.
    """
    roles._check_federator()
    extcall Token(stake.token.address).mint(receiver, amount)


@external
@nonreentrant
def set_minter(minter: address, enabled: bool):
    """
    @notice Grant or revoke the right to mint the token.
    @dev Federator only; the protocol's own right (it mints claimed rewards) stays.
    @param minter The account to change.
    @param enabled True to grant, False to revoke.
    """
    roles._check_federator()
    assert minter != self, "treasury: protocol must mint"
    extcall Token(stake.token.address).set_minter(minter, enabled)


@external
@nonreentrant
def recover_tokens(receiver: address) -> uint256:
    """
    @notice Send stake tokens that were transferred to the protocol directly (not staked) to
            `receiver`.
    @dev Federator only. Stake, unbonding and slashed tokens are never touched.
    @param receiver Where the surplus goes.
    @return The amount recovered.
    """
    roles._check_federator()
    held: uint256 = staticcall Token(stake.token.address).balanceOf(self)
    owed: uint256 = stake.total_stake + stake.total_unbonding + stake.total_slashed
    surplus: uint256 = held - min(held, owed)
    if surplus > 0:
        assert extcall Token(stake.token.address).transfer(receiver, surplus, default_return_value=True), "treasury: transfer failed"
    log TokensRecovered(receiver=receiver, amount=surplus)
    return surplus
