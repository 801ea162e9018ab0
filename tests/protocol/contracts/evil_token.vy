# pragma version ~=0.4.3
"""
@title Re-entering token (test only)
@notice An ERC-20 that is also a provider of the protocol it backs: when the protocol pays it
        (transfer on withdraw, mint on claim) it calls back into the protocol with a prepared
        payload, and records whether the re-entry succeeded and what it returned.
"""

balanceOf: public(HashMap[address, uint256])
allowance: public(HashMap[address, HashMap[address, uint256]])
totalSupply: public(uint256)
protocol: public(address)
payload: public(Bytes[512])
armed: public(bool)
reentered: public(bool)
reentry_ok: public(bool)
reentry_data: public(Bytes[256])


@external
def transfer(receiver: address, amount: uint256) -> bool:
    self._hook()
    self.balanceOf[msg.sender] -= amount
    self.balanceOf[receiver] += amount
    return True


@external
def transferFrom(owner: address, receiver: address, amount: uint256) -> bool:
    self.allowance[owner][msg.sender] -= amount
    self.balanceOf[owner] -= amount
    self.balanceOf[receiver] += amount
    return True


@external
def approve(spender: address, amount: uint256) -> bool:
    self.allowance[msg.sender][spender] = amount
    return True


@external
def mint(receiver: address, amount: uint256):
    self._hook()
    self.totalSupply += amount
    self.balanceOf[receiver] += amount


@external
def arm(protocol: address, payload: Bytes[512]):
    self.protocol = protocol
    self.payload = payload
    self.armed = True


@external
def execute(target: address, data: Bytes[512]):
    """Act as a provider: call `target` with `data` as this contract."""
    raw_call(target, data)


@internal
def _hook():
    if self.armed and msg.sender == self.protocol:
        self.armed = False
        self.reentered = True
        ok: bool = False
        out: Bytes[256] = b""
        ok, out = raw_call(self.protocol, self.payload, max_outsize=256, revert_on_failure=False)
        self.reentry_ok = ok
        self.reentry_data = out
