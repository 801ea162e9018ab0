# pragma version ~=0.4.3
"""
@title MeshToken
@notice The ERC-20 used for stake and rewards. The owner appoints minters (the protocol
        contract mints rewards when they are claimed). At deployment the deployer hands
        ownership to the protocol contract and gives up its own minting right, so the token's
        powers move with the protocol's federator role.
@dev `approve` overwrites an allowance, so changing a non-zero allowance to another non-zero
     value lets a spender that front-runs the change spend both. Use `increaseAllowance` /
     `decreaseAllowance` (the latter reverts if the spender already spent too much) or set the
     allowance to zero first.
"""

from ethereum.ercs import IERC20

implements: IERC20

event Transfer:
    sender: indexed(address)
    receiver: indexed(address)
    value: uint256

event Approval:
    owner: indexed(address)
    spender: indexed(address)
    value: uint256

event MinterSet:
    minter: indexed(address)
    enabled: bool

event OwnershipTransferred:
    previous: indexed(address)
    owner: indexed(address)


name: public(String[32])
symbol: public(String[8])
decimals: public(constant(uint8)) = 18
totalSupply: public(uint256)
balanceOf: public(HashMap[address, uint256])
allowance: public(HashMap[address, HashMap[address, uint256]])
owner: public(address)
minters: public(HashMap[address, bool])


@deploy
def __init__(name_: String[32], symbol_: String[8]):
    self.name = name_
    self.symbol = symbol_
    self.owner = msg.sender
    self.minters[msg.sender] = True
    log MinterSet(minter=msg.sender, enabled=True)


@external
def transfer(receiver: address, amount: uint256) -> bool:
    """
    @notice Move `amount` from the caller to `receiver`.
    @param receiver The recipient.
    @param amount The amount in base units.
    @return True on success.
    """
    self._transfer(msg.sender, receiver, amount)
    return True


@external
def transferFrom(owner: address, receiver: address, amount: uint256) -> bool:
    """
    @notice Move `amount` from `owner` to `receiver` using the caller's allowance.
    @param owner The account debited.
    @param receiver The recipient.
    @param amount The amount in base units.
    @return True on success.
    """
    allowed: uint256 = self.allowance[owner][msg.sender]
    if allowed != max_value(uint256):
        assert allowed >= amount, "token: allowance exceeded"
        self.allowance[owner][msg.sender] = allowed - amount
    self._transfer(owner, receiver, amount)
    return True


@external
def approve(spender: address, amount: uint256) -> bool:
    """
    @notice Let `spender` move up to `amount` of the caller's tokens.
    @param spender The account allowed to spend.
    @param amount The allowance.
    @return True on success.
    """
    self.allowance[msg.sender][spender] = amount
    log Approval(owner=msg.sender, spender=spender, value=amount)
    return True


@external
def increaseAllowance(spender: address, added: uint256) -> bool:
    """
    @notice Raise `spender`'s allowance by `added` (race-free, unlike `approve`).
    @param spender The account allowed to spend.
    @param added The amount added to the allowance.
    @return True on success.
    """
    allowed: uint256 = self.allowance[msg.sender][spender] + added
    self.allowance[msg.sender][spender] = allowed
    log Approval(owner=msg.sender, spender=spender, value=allowed)
    return True


@external
def decreaseAllowance(spender: address, subtracted: uint256) -> bool:
    """
    @notice Lower `spender`'s allowance by `subtracted`; reverts if less than that is left.
    @dev A spender that front-ran the change has already used its allowance, so the decrease
         reverts instead of granting a fresh one.
    @param spender The account allowed to spend.
    @param subtracted The amount taken off the allowance.
    @return True on success.
    """
    allowed: uint256 = self.allowance[msg.sender][spender]
    assert allowed >= subtracted, "token: allowance below decrease"
    self.allowance[msg.sender][spender] = allowed - subtracted
    log Approval(owner=msg.sender, spender=spender, value=allowed - subtracted)
    return True


@external
def mint(receiver: address, amount: uint256):
    """
    @notice Create `amount` new tokens for `receiver`.
    @dev Minters only.
    @param receiver The recipient.
    @param amount The amount in base units.
    """
    assert self.minters[msg.sender], "token: not minter"
    assert receiver != empty(address), "token: zero address"
    self.totalSupply += amount
    self.balanceOf[receiver] += amount
    log Transfer(sender=empty(address), receiver=receiver, value=amount)


@external
def set_minter(minter: address, enabled: bool):
    """
    @notice Grant or revoke the right to mint.
    @dev Owner only.
    @param minter The account to change.
    @param enabled True to grant, False to revoke.
    """
    assert msg.sender == self.owner, "token: not owner"
    self.minters[minter] = enabled
    log MinterSet(minter=minter, enabled=enabled)


@external
def transfer_ownership(owner: address):
    """
    @notice Hand the right to appoint minters to `owner` (at deployment: the protocol).
    @dev Owner only. The previous owner keeps only the minting right it gave itself, if any.
    @param owner The new owner.
    """
    assert msg.sender == self.owner, "token: not owner"
    assert owner != empty(address), "token: zero address"
    log OwnershipTransferred(previous=self.owner, owner=owner)
    self.owner = owner


@internal
def _transfer(owner: address, receiver: address, amount: uint256):
    assert receiver != empty(address), "token: zero address"
    assert self.balanceOf[owner] >= amount, "token: balance too low"
    self.balanceOf[owner] -= amount
    self.balanceOf[receiver] += amount
    log Transfer(sender=owner, receiver=receiver, value=amount)
