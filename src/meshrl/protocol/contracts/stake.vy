# pragma version ~=0.4.3
"""
@title Stake
@notice Providers register with stake. The minimum stake grows with the compute units of
        their nodes; unstaking waits out an unbonding delay, never shorter than the work module's
        invalidation window (so stake cannot leave before its last work is judged). Stake is
        slashed by hard invalidations of work, or by the federator.
@dev Slashed tokens stay in the contract (`total_slashed`) until the federator collects them.
     A withdrawal also waits until no invalidation window can still judge the provider's
     work (`judgeable_until`) and no verdict against it is still open (`open_verdicts`).
     Validators post bonds here (`post_bond`); a verdict locks part of its validator's bond
     until it is settled, and an overturned verdict hands that part to the wronged provider's
     stake.
     A vote locks part of its voter's bond too, and a challenge moves a deposit out of the
     provider's stake until its verdict settles (`total_deposits`).
     Invariant: total_stake == sum(stake), total_unbonding == sum(unbonding),
     total_bonds == sum(bonds), total_deposits == the deposits of open verdicts.
"""

from ethereum.ercs import IERC20
from . import roles

uses: roles

struct Provider:
    registered: bool
    stake: uint256
    unbonding: uint256
    unlock_at: uint256
    compute_units: uint256

event ProviderRegistered:
    provider: indexed(address)
    amount: uint256

event StakeAdded:
    provider: indexed(address)
    amount: uint256

event UnstakeRequested:
    provider: indexed(address)
    amount: uint256
    unlock_at: uint256

event Withdrawn:
    provider: indexed(address)
    amount: uint256

event Slashed:
    provider: indexed(address)
    amount: uint256
    by: indexed(address)

event BondPosted:
    validator: indexed(address)
    amount: uint256

event BondWithdrawn:
    validator: indexed(address)
    amount: uint256

event BondForfeited:
    validator: indexed(address)
    provider: indexed(address)
    amount: uint256

event StakeParamsSet:
    min_stake: uint256
    stake_per_unit: uint256
    unbonding_delay: uint256


token: public(IERC20)
providers: public(HashMap[address, Provider])
total_stake: public(uint256)
total_unbonding: public(uint256)
total_slashed: public(uint256)
min_stake: public(uint256)
stake_per_unit: public(uint256)
unbonding_delay: public(uint256)
# The work module's invalidation window, mirrored here so the two parameters stay ordered.
min_unbonding_delay: public(uint256)
# provider -> the latest time an invalidation window of its submitted work closes
judgeable_until: public(HashMap[address, uint256])
# provider -> verdicts against its work not yet settled
open_verdicts: public(HashMap[address, uint256])
bonds: public(HashMap[address, uint256])
bond_locked: public(HashMap[address, uint256])
total_bonds: public(uint256)
# challenge deposits held until their verdicts settle
total_deposits: public(uint256)


@deploy
def __init__(token: IERC20, min_stake: uint256, stake_per_unit: uint256, unbonding_delay: uint256):
    self.token = token
    self._set_params(min_stake, stake_per_unit, unbonding_delay)


@external
@nonreentrant
def register_provider(amount: uint256):
    """
    @notice Register the caller as a provider, staking `amount` (needs a token allowance).
    @param amount Initial stake; at least `min_stake`.
    """
    assert not self.providers[msg.sender].registered, "stake: already registered"
    assert amount >= self.min_stake, "stake: below minimum"
    self.providers[msg.sender].registered = True
    self._deposit(amount)
    log ProviderRegistered(provider=msg.sender, amount=amount)


@external
@nonreentrant
def add_stake(amount: uint256):
    """
    @notice Add `amount` to the caller's stake (needs a token allowance).
    @param amount The amount to add; must be positive.
    """
    self._check_provider(msg.sender)
    self._check_positive(amount)
    self._deposit(amount)
    log StakeAdded(provider=msg.sender, amount=amount)


@external
def request_unstake(amount: uint256):
    """
    @notice Move `amount` of stake into unbonding; it can be withdrawn after the delay.
    @dev The remaining stake must still cover the minimum for the caller's nodes. A new
         request restarts the delay for everything unbonding.
    @param amount The amount to unbond.
    """
    p: Provider = self.providers[msg.sender]
    self._check_provider(msg.sender)
    self._check_positive(amount)
    assert amount <= p.stake, "stake: amount exceeds stake"
    assert p.stake - amount >= self._required(p.compute_units), "stake: below minimum for nodes"
    unlock_at: uint256 = block.timestamp + self.unbonding_delay
    self.providers[msg.sender].stake = p.stake - amount
    self.providers[msg.sender].unbonding = p.unbonding + amount
    self.providers[msg.sender].unlock_at = unlock_at
    self.total_stake -= amount
    self.total_unbonding += amount
    log UnstakeRequested(provider=msg.sender, amount=amount, unlock_at=unlock_at)


@external
@nonreentrant
def withdraw() -> uint256:
    """
    @notice Withdraw everything whose unbonding delay has passed.
    @return The amount transferred to the caller.
    """
    p: Provider = self.providers[msg.sender]
    assert p.unbonding > 0, "stake: nothing unbonding"
    assert block.timestamp >= p.unlock_at, "stake: still unbonding"
    assert block.timestamp >= self.judgeable_until[msg.sender], "stake: work still judgeable"
    assert self.open_verdicts[msg.sender] == 0, "stake: verdict pending"
    self.providers[msg.sender].unbonding = 0
    self.total_unbonding -= p.unbonding
    self._push(msg.sender, p.unbonding)
    log Withdrawn(provider=msg.sender, amount=p.unbonding)
    return p.unbonding


@external
def slash(provider: address, amount: uint256) -> uint256:
    """
    @notice Take up to `amount` from a provider's stake (then from its unbonding tokens).
    @dev Federator only: validators slash only through `hard_invalidate`, tied to a work item
         and limited to `slash_penalty`.
    @param provider The provider to slash.
    @param amount The penalty.
    @return The amount actually slashed.
    """
    roles._check_federator()
    self._check_provider(provider)
    return self._slash(provider, amount)


@external
@nonreentrant
def collect_slashed(receiver: address) -> uint256:
    """
    @notice Send all slashed tokens to `receiver`.
    @dev Federator only.
    @param receiver The treasury account.
    @return The amount transferred.
    """
    roles._check_federator()
    amount: uint256 = self.total_slashed
    self.total_slashed = 0
    self._push(receiver, amount)
    return amount


@external
@nonreentrant
def post_bond(amount: uint256):
    """
    @notice Add `amount` to the caller's validator bond (needs a token allowance).
    @dev Each open verdict of a validator locks `verdict_bond` of it.
    @param amount The amount to add; must be positive.
    """
    self._check_positive(amount)
    self.bonds[msg.sender] += amount
    self.total_bonds += amount
    self._pull(amount)
    log BondPosted(validator=msg.sender, amount=amount)


@external
@nonreentrant
def withdraw_bond(amount: uint256):
    """
    @notice Withdraw `amount` of the caller's bond not locked by open verdicts.
    @param amount The amount to withdraw.
    """
    assert amount <= self.bonds[msg.sender] - self.bond_locked[msg.sender], "stake: bond locked"
    self.bonds[msg.sender] -= amount
    self.total_bonds -= amount
    self._push(msg.sender, amount)
    log BondWithdrawn(validator=msg.sender, amount=amount)


@external
def set_stake_params(min_stake: uint256, stake_per_unit: uint256, unbonding_delay: uint256):
    """
    @notice Set the registration minimum, the stake per compute unit and the unbonding delay.
    @dev Federator only.
    @param min_stake Minimum stake to register.
    @param stake_per_unit Stake required per compute unit of a provider's nodes.
    @param unbonding_delay Seconds between an unstake request and its withdrawal.
    """
    roles._check_federator()
    self._set_params(min_stake, stake_per_unit, unbonding_delay)


@external
@view
def required_stake(provider: address) -> uint256:
    """
    @notice The stake `provider` must keep for the nodes it has.
    @param provider The provider.
    @return The minimum stake.
    """
    return self._required(self.providers[provider].compute_units)


@internal
def _push(receiver: address, amount: uint256):
    # one call site per revert reason keeps the contract under the code-size limit
    assert extcall self.token.transfer(receiver, amount, default_return_value=True), "stake: transfer failed"


@internal
def _pull(amount: uint256):
    assert extcall self.token.transferFrom(msg.sender, self, amount, default_return_value=True), "stake: transfer failed"


@internal
@view
def _check_provider(provider: address):
    assert self.providers[provider].registered, "stake: not a provider"


@internal
@pure
def _check_positive(amount: uint256):
    assert amount > 0, "stake: zero amount"


@internal
def _set_params(min_stake: uint256, stake_per_unit: uint256, unbonding_delay: uint256):
    assert unbonding_delay >= self.min_unbonding_delay, "stake: unbonding shorter than window"
    self.min_stake = min_stake
    self.stake_per_unit = stake_per_unit
    self.unbonding_delay = unbonding_delay
    log StakeParamsSet(min_stake=min_stake, stake_per_unit=stake_per_unit, unbonding_delay=unbonding_delay)


@internal
@view
def _required(compute_units: uint256) -> uint256:
    if compute_units == 0:
        return 0
    return max(self.min_stake, compute_units * self.stake_per_unit)


@internal
@view
def _check_covered(provider: address):
    # A provider slashed below what its nodes require may not work or earn until it tops up.
    required: uint256 = self._required(self.providers[provider].compute_units)
    assert self.providers[provider].stake >= required, "stake: below minimum for nodes"


@internal
def _deposit(amount: uint256):
    self.providers[msg.sender].stake += amount
    self.total_stake += amount
    self._pull(amount)


@internal
def _slash(provider: address, amount: uint256) -> uint256:
    p: Provider = self.providers[provider]
    from_stake: uint256 = min(amount, p.stake)
    from_unbonding: uint256 = min(amount - from_stake, p.unbonding)
    self.providers[provider].stake = p.stake - from_stake
    self.providers[provider].unbonding = p.unbonding - from_unbonding
    self.total_stake -= from_stake
    self.total_unbonding -= from_unbonding
    self.total_slashed += from_stake + from_unbonding
    log Slashed(provider=provider, amount=from_stake + from_unbonding, by=msg.sender)
    return from_stake + from_unbonding


@internal
@view
def _owed() -> uint256:
    return self.total_stake + self.total_unbonding + self.total_slashed + self.total_bonds + self.total_deposits


@internal
def _note_deadline(provider: address, deadline: uint256):
    if deadline > self.judgeable_until[provider]:
        self.judgeable_until[provider] = deadline


@internal
@view
def _check_bond(validator: address, amount: uint256):
    assert self.bonds[validator] - self.bond_locked[validator] >= amount, "stake: bond too low"


@internal
def _lock_bond(validator: address, amount: uint256):
    self._check_bond(validator, amount)
    self.bond_locked[validator] += amount


@internal
def _release_bond(validator: address, amount: uint256):
    self.bond_locked[validator] -= amount


@internal
def _forfeit_bond(validator: address, amount: uint256, provider: address):
    # The locked part of an overturned verdict's bond becomes the wronged provider's stake.
    self.bond_locked[validator] -= amount
    self.bonds[validator] -= amount
    self.total_bonds -= amount
    self.providers[provider].stake += amount
    self.total_stake += amount
    log BondForfeited(validator=validator, provider=provider, amount=amount)


@internal
def _debit_bond(validator: address, amount: uint256):
    # A losing voter's locked stake leaves its bond (credited to the winners by the caller).
    self.bond_locked[validator] -= amount
    self.bonds[validator] -= amount
    self.total_bonds -= amount


@internal
def _credit_bond(validator: address, amount: uint256):
    self.bonds[validator] += amount
    self.total_bonds += amount


@internal
def _credit_stake(provider: address, amount: uint256):
    self.providers[provider].stake += amount
    self.total_stake += amount


@internal
def _take_deposit(provider: address, amount: uint256):
    assert self.providers[provider].stake >= amount, "stake: below challenge deposit"
    self.providers[provider].stake -= amount
    self.total_stake -= amount
    self.total_deposits += amount


@internal
def _refund_deposit(provider: address, amount: uint256):
    self.total_deposits -= amount
    self._credit_stake(provider, amount)


@internal
def _deposit_to_bond(amount: uint256, validator: address):
    self.total_deposits -= amount
    self._credit_bond(validator, amount)


@internal
def _set_min_unbonding_delay(delay: uint256):
    assert self.unbonding_delay >= delay, "work: window longer than unbonding"
    self.min_unbonding_delay = delay


@internal
def _add_units(provider: address, units: uint256):
    new_units: uint256 = self.providers[provider].compute_units + units
    assert self.providers[provider].stake >= self._required(new_units), "stake: below minimum for nodes"
    self.providers[provider].compute_units = new_units


@internal
def _remove_units(provider: address, units: uint256):
    self.providers[provider].compute_units -= units


@internal
def _open_verdict(provider: address):
    self.open_verdicts[provider] += 1


@internal
def _close_verdict(provider: address):
    self.open_verdicts[provider] -= 1
