# pragma version ~=0.4.3
"""
@title Roles
@notice The federator administers domains, pools, reward rates and the validator set;
        validators verify work and may invalidate it and slash stake.
"""

event ValidatorSet:
    validator: indexed(address)
    enabled: bool

event FederatorTransferred:
    previous: indexed(address)
    federator: indexed(address)


federator: public(address)
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
def transfer_federator(federator: address):
    """
    @notice Hand the federator role to another account.
    @dev Federator only.
    @param federator The new federator.
    """
    self._check_federator()
    assert federator != empty(address), "roles: zero address"
    log FederatorTransferred(previous=self.federator, federator=federator)
    self.federator = federator


@internal
@view
def _check_federator():
    assert msg.sender == self.federator, "roles: not federator"


@internal
@view
def _check_validator():
    assert self.validators[msg.sender], "roles: not validator"
