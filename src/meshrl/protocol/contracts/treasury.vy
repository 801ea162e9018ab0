# pragma version ~=0.4.3
"""
@title Treasury
@notice The token's powers, held by the protocol contract and exercised by the federator, so
        that handing over the federator role hands them over too: minting, appointing minters
        (the protocol's own minting right cannot be revoked), and recovering stake tokens sent
        to the protocol by mistake. The hand-over itself is accepted here, because it revokes
        the minters the outgoing federator appointed.
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

MAX_MINTERS: constant(uint256) = 16

event TokensRecovered:
    receiver: indexed(address)
    amount: uint256


# The minters appointed through the protocol (besides the protocol itself), in order.
minter_list: DynArray[address, MAX_MINTERS]


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
    @dev Federator only; the protocol's own right (it mints claimed rewards) stays. At most
         MAX_MINTERS appointed minters at a time; a hand-over revokes them by default.
    @param minter The account to change.
    @param enabled True to grant, False to revoke.
    """
    roles._check_federator()
    assert minter != self, "treasury: protocol must mint"
    self._forget(minter)
    if enabled:
        assert len(self.minter_list) < MAX_MINTERS, "treasury: too many minters"
        self.minter_list.append(minter)
    extcall Token(stake.token.address).set_minter(minter, enabled)


@external
@nonreentrant
def accept_federator(keep_grants: bool):
    """
    @notice Take over the federator role (and with it the protocol's token powers).
    @dev Only the proposed account. Unless `keep_grants`, every validator grant, pool manager
         and minter of the outgoing tenure is revoked (list them first: `granted_minters`,
         the `ValidatorSet` / `PoolManagerSet` events); with `keep_grants` only the outgoing
         key's own validator, pool-manager and minting rights are.
    @param keep_grants Keep the outgoing tenure's validators, managers and minters.
    """
    previous: address = roles.federator
    roles._accept_federator(not keep_grants)
    token: address = stake.token.address
    if not keep_grants:
        for m: address in self.minter_list:
            extcall Token(token).set_minter(m, False)
        self.minter_list = []
    elif previous in self.minter_list:
        self._forget(previous)
        extcall Token(token).set_minter(previous, False)


@external
@view
def granted_minters() -> DynArray[address, MAX_MINTERS]:
    """
    @notice The minters appointed through the protocol, which a hand-over revokes by default.
    @return Their addresses.
    """
    return self.minter_list


@external
@nonreentrant
def recover_tokens(receiver: address) -> uint256:
    """
    @notice Send stake tokens that were transferred to the protocol directly (not staked) to
            `receiver`.
    @dev Federator only. Stake, unbonding, slashed and bonded tokens are never touched.
    @param receiver Where the surplus goes.
    @return The amount recovered.
    """
    roles._check_federator()
    held: uint256 = staticcall Token(stake.token.address).balanceOf(self)
    owed: uint256 = stake._owed()
    surplus: uint256 = held - min(held, owed)
    if surplus > 0:
        assert extcall Token(stake.token.address).transfer(receiver, surplus, default_return_value=True), "treasury: transfer failed"
    log TokensRecovered(receiver=receiver, amount=surplus)
    return surplus


@internal
def _forget(minter: address):
    n: uint256 = len(self.minter_list)
    for i: uint256 in range(MAX_MINTERS):
        if i >= n:
            return
        if self.minter_list[i] == minter:
            self.minter_list[i] = self.minter_list[n - 1]
            self.minter_list.pop()
            return
