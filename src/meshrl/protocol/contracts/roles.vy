# pragma version ~=0.4.3
"""
@title Roles
@notice The federator administers domains, pools, reward rates, the validator set and the
        token (through the protocol); validators verify work and may invalidate it. The role
        changes hands in two steps (propose, accept), and with it every power it carries.
@dev Every validator grant and pool-manager appointment belongs to the federator tenure
     (`federator_epoch`) that made it. A hand-over revokes them all by default (the new
     federator re-grants whom it trusts); a new federator that keeps them still strips the
     outgoing key of its own validator right. The token minters the outgoing federator
     appointed are revoked by the treasury (`treasury._revoke_minters`).
"""

event ValidatorSet:
    validator: indexed(address)
    enabled: bool

event FederatorProposed:
    federator: indexed(address)
    proposed: indexed(address)

event FederatorTransferred:
    previous: indexed(address)
    federator: indexed(address)
    revoked: bool


federator: public(address)
pending_federator: public(address)
# The tenure of the current federator; grants of an earlier tenure are void unless kept.
federator_epoch: public(uint256)
# validator -> 1 + the tenure that granted it (0: not a validator)
validator_grant: public(HashMap[address, uint256])
# hand-overs so far; and for an outgoing key stripped by a hand-over that kept the grants,
# the hand-over that stripped it (appointments it held from before are void)
handovers: public(uint256)
stripped_at: public(HashMap[address, uint256])


@deploy
def __init__():
    self.federator = msg.sender


@external
def set_validator(validator: address, enabled: bool):
    """
    @notice Grant or revoke the validator role (a validator acts only with a bond posted).
    @dev Federator only; the grant belongs to the current federator's tenure.
    @param validator The account to change.
    @param enabled True to grant, False to revoke.
    """
    self._check_federator()
    assert validator != empty(address), "roles: zero address"
    self.validator_grant[validator] = self.federator_epoch + 1 if enabled else 0
    log ValidatorSet(validator=validator, enabled=enabled)


@external
@view
def validators(validator: address) -> bool:
    """
    @notice Whether `validator` holds the validator role now.
    @param validator The account.
    @return True when granted in the current federator tenure.
    """
    return self._is_validator(validator)


@external
def propose_federator(federator: address):
    """
    @notice Propose the account that may take over the federator role (empty address: cancel).
    @dev Federator only. Nothing moves until the proposed account calls `accept_federator`.
    @param federator The proposed federator.
    """
    self._check_federator()
    self.pending_federator = federator
    log FederatorProposed(federator=msg.sender, proposed=federator)


@internal
def _accept_federator(revoke: bool):
    assert msg.sender == self.pending_federator, "roles: not proposed federator"
    previous: address = self.federator
    self.handovers += 1
    if revoke:
        self.federator_epoch += 1  # every validator grant and pool manager of the old tenure
    else:
        # kept grants never include the outgoing key's own: its validator right and any pool
        # it appointed itself to manage
        self.stripped_at[previous] = self.handovers
        if self.validator_grant[previous] != 0:
            self.validator_grant[previous] = 0
            log ValidatorSet(validator=previous, enabled=False)
    log FederatorTransferred(previous=previous, federator=msg.sender, revoked=revoke)
    self.federator = msg.sender
    self.pending_federator = empty(address)


@internal
@view
def _is_validator(validator: address) -> bool:
    return self.validator_grant[validator] == self.federator_epoch + 1


@internal
@view
def _check_federator():
    assert msg.sender == self.federator, "roles: not federator"


@internal
@view
def _check_validator():
    assert self._is_validator(msg.sender), "roles: not validator"
