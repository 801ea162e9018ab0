# pragma version ~=0.4.3
"""
@title Roles
@notice The federator administers domains, pools, reward rates, the validator set and the
        token (through the protocol); validators verify work and may invalidate it. The role
        changes hands in two steps (propose, accept), and with it every power it carries.
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


federator: public(address)
pending_federator: public(address)
validators: public(HashMap[address, bool])


@deploy
def __init__():
    self.federator = msg.sender


@external
def set_validator(validator: address, enabled: bool):
    """
    @notice Grant or revoke the validator role.
    @dev Federator only.
    @param validator The account to change.
    @param enabled True to grant, False to revoke.
    """
    self._check_federator()
    assert validator != empty(address), "roles: zero address"
    self.validators[validator] = enabled
    log ValidatorSet(validator=validator, enabled=enabled)


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


@external
def accept_federator():
    """
    @notice Take over the federator role (and with it the protocol's token powers).
    @dev Only the proposed account; the old federator keeps no power.
    """
    assert msg.sender == self.pending_federator, "roles: not proposed federator"
    log FederatorTransferred(previous=self.federator, federator=msg.sender)
    self.federator = msg.sender
    self.pending_federator = empty(address)


@internal
@view
def _check_federator():
    assert msg.sender == self.federator, "roles: not federator"


@internal
@view
def _check_validator():
    assert self.validators[msg.sender], "roles: not validator"
