"""Chain backends: an in-process py-evm chain (eth-tester) and any JSON-RPC endpoint (anvil,
Base Sepolia). Both sign with local eth-account keys and send raw transactions, and both turn
every failure mode of a reverted transaction into `TxReverted` with the contract's reason
(the subclass `errors.REVERTS` names for it, if any):

- eth-tester raises its own `TransactionFailed` (at gas estimation or when sending);
- JSON-RPC nodes answer gas estimation with an "execution reverted: ..." error;
- a transaction sent with explicit gas is mined and comes back as a status-0 receipt: the
  call is replayed against the parent block to recover the reason.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import TimeExhausted
from web3.types import TxReceipt

from meshrl.protocol.errors import HTTP_REFUSALS, ChainError, TxReverted, reverted
from meshrl.protocol.viewcall import view_call

__all__ = ["Backend", "EthTesterBackend", "RpcBackend", "revert_reason"]

_REASON = re.compile(r"execution reverted:?\s*(.*)", re.S)


def revert_reason(exc: BaseException) -> str | None:
    """The revert message inside an exception of eth-tester, web3 or a JSON-RPC node, else None."""
    from eth_tester.exceptions import TransactionFailed
    from web3.exceptions import ContractLogicError

    if isinstance(exc, ContractLogicError):
        text = exc.message or str(exc)
    elif isinstance(exc, TransactionFailed):
        arg = exc.args[0] if exc.args else ""
        text = arg.decode(errors="replace") if isinstance(arg, bytes) else str(arg)
        if "execution reverted" not in text:
            return "out of gas" if "out of gas" in text.lower() else text.strip("'\"")
    elif isinstance(exc, ValueError) and exc.args and isinstance(exc.args[0], dict):
        text = str(exc.args[0].get("message", ""))
    else:
        text = str(exc)
    if "out of gas" in text.lower():
        return "out of gas"
    m = _REASON.search(text)
    if m is None:
        return None
    return m.group(1).strip().strip("'\"")


class Backend:
    """A Web3 connection plus the few chain controls the protocol and its tests need."""

    name = "base"

    def __init__(self, w3: Web3, receipt_timeout: float = 120.0):
        # web3's validation middleware asks the node for its chain id before every eth_call
        # and gas estimate: a second round trip per view call (4.6 -> 1.6 ms of CPU an
        # eth_call against anvil without it). Its one check, a transaction's chainId against
        # the node's, is the node's own for the raw transactions signed here (EIP-155).
        if "validation" in w3.middleware_onion:
            w3.middleware_onion.remove("validation")
        self.w3 = w3
        self.receipt_timeout = receipt_timeout
        # preflight: estimate gas (and so catch reverts) before sending. Without it every tx
        # goes on chain with `unchecked_gas` and a revert comes back as a status-0 receipt.
        self.preflight = True
        self.unchecked_gas = 2_000_000
        self._chain_id: int | None = None
        # one transaction of a sender at a time in this process: its nonce is picked, the tx
        # sent and its receipt awaited under the lock, so two threads of one process (a
        # worker's courier and its claimer) never pick the same nonce
        self._senders: dict[str, threading.Lock] = {}
        self._senders_lock = threading.Lock()

    @property
    def chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = int(self.w3.eth.chain_id)
        return self._chain_id

    def now(self) -> int:
        """Timestamp of the latest block."""
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def block_number(self) -> int:
        return int(self.w3.eth.block_number)

    def block_hash(self, number: int) -> str:
        """Hash (0x-hex) of block `number`: what picks the rows a validator replays of a file
        submitted in it (meshrl.pool.sampled)."""
        return "0x" + bytes(self.w3.eth.get_block(number)["hash"]).hex()

    def send(self, account: LocalAccount, tx: dict[str, Any]) -> TxReceipt:
        """Fill, sign with `account` and send `tx`; wait for its receipt; raise on revert.
        Transactions of one sender are serialized (see `_senders`)."""
        with self._senders_lock:
            lock = self._senders.setdefault(account.address.lower(), threading.Lock())
        with lock:
            return self._send(account, tx)

    def _send(self, account: LocalAccount, tx: dict[str, Any]) -> TxReceipt:
        tx = dict(tx)
        tx["from"] = account.address
        tx.setdefault("chainId", self.chain_id)
        tx.setdefault("nonce", self.w3.eth.get_transaction_count(account.address, "pending"))
        tx.setdefault("gasPrice", self.w3.eth.gas_price)
        tx.setdefault("value", 0)
        if "gas" not in tx and not self.preflight:
            tx["gas"] = self.unchecked_gas
        if "gas" not in tx:
            tx["gas"] = self._call_guarded(lambda: self.estimate_gas(tx))
        signed = account.sign_transaction(tx)
        tx_hash = self._call_guarded(
            lambda: self.w3.eth.send_raw_transaction(signed.raw_transaction)
        )
        try:
            receipt = self.w3.eth.wait_for_transaction_receipt(
                tx_hash, timeout=self.receipt_timeout, poll_latency=0.05
            )
        except TimeExhausted:
            # e.g. a node that accepted, then dropped, a tx below the intrinsic gas floor
            raise ChainError(
                f"tx 0x{bytes(tx_hash).hex()} not mined after {self.receipt_timeout}s"
            ) from None
        if receipt["status"] != 1:
            tx_hex = "0x" + bytes(receipt["transactionHash"]).hex()
            raise reverted(self._replay_reason(tx, receipt), tx_hash=tx_hex)
        return receipt

    def estimate_gas(self, tx: dict[str, Any]) -> int:
        """Gas limit for `tx` with a 20% margin; raises the node's error when it would revert."""
        return self.w3.eth.estimate_gas(tx) * 6 // 5 + 10_000  # type: ignore[arg-type]

    def call(self, fn: Any, sender: str | None = None, block: int | str = "latest") -> Any:
        """Run a contract view call, mapping reverts to `TxReverted`."""
        params = {"from": sender} if sender else None
        return self._call_guarded(lambda: fn.call(params, block_identifier=block))

    def call_many(self, fns: list[Any], chunk: int = 100) -> list[Any]:
        """Many view calls at the latest block: one JSON-RPC batch per `chunk` calls where the
        node takes batches (one round trip instead of one per call), else one by one. 100 is
        the public RPC filter's bound (`chain rpc-filter`, `max_batch`) and a common one of
        hosted nodes; a batch the node refuses anyway (an HTTP 400, a JSON-RPC error) is sent
        again one call at a time, where a real failure raises as it would have."""
        out: list[Any] = []
        for i in range(0, len(fns), chunk):
            part = fns[i:i + chunk]
            # encoded here once per function where its types allow (viewcall.py: web3's own
            # encoding hashed every signature of the ABI per call)
            raw = [view_call(fn) for fn in part]
            try:
                got = self._raw_batch(raw) if None not in raw else None
                if got is None:
                    with self.w3.batch_requests() as batch:
                        for fn in part:
                            batch.add(fn)
                        got = batch.execute()
            except Exception:  # no batches here, or not this many: one by one
                got = [self.call(fn) for fn in part]
            out.extend(got)
        return out

    def _raw_batch(self, calls: list[Any]) -> list[Any] | None:
        """Encoded view calls (`view_call`) in one JSON-RPC batch sent by the provider itself
        (web3's request formatters took another 0.8 ms a call); None where the provider has no
        batches, or the node answered one call with an error (the caller asks again its way)."""
        send = getattr(self.w3.provider, "make_batch_request", None)
        if send is None:
            return None
        answers = send([("eth_call", [tx, "latest"]) for tx, _ in calls])  # type: ignore[misc]
        if not isinstance(answers, list) or len(answers) != len(calls) or any(
                "result" not in a for a in answers):
            return None
        return [decode(bytes.fromhex(str(a["result"]).removeprefix("0x")))
                for a, (_, decode) in zip(answers, calls, strict=True)]

    def _call_guarded(self, thunk: Any) -> Any:
        try:
            return thunk()
        except TxReverted:
            raise
        except Exception as e:  # every backend has its own revert exception type
            status = getattr(getattr(e, "response", None), "status_code", None)
            typed = HTTP_REFUSALS.get(status) if isinstance(status, int) else None
            if typed is not None:
                raise typed(f"{self.name}: {type(e).__name__}: {e}") from e
            reason = revert_reason(e)
            if reason is None:
                raise ChainError(f"{self.name}: {type(e).__name__}: {e}") from e
            raise reverted(reason) from None

    def _replay_reason(self, tx: dict[str, Any], receipt: TxReceipt) -> str:
        # A REVERT hands back unused gas; an exceptional halt (out of gas, EIP-2200's SSTORE
        # sentry, ...) burns it all.
        if receipt["gasUsed"] >= tx["gas"]:
            return "out of gas"
        call = {k: tx[k] for k in ("from", "to", "data", "value") if k in tx}
        call["gas"] = tx["gas"]
        try:
            self.w3.eth.call(call, block_identifier=receipt["blockNumber"] - 1)  # type: ignore[arg-type]
        except Exception as e:
            return revert_reason(e) or ""
        return ""

    # chain controls (local chains only)
    def advance_time(self, seconds: int) -> None:
        raise ChainError(f"{self.name}: cannot change time on this chain")

    def snapshot(self) -> Any:
        raise ChainError(f"{self.name}: snapshots are not supported")

    def revert(self, snapshot_id: Any) -> None:
        raise ChainError(f"{self.name}: snapshots are not supported")

    def fund(self, address: str, wei: int) -> None:
        raise ChainError(f"{self.name}: cannot mint ether on this chain")


class EthTesterBackend(Backend):
    """The in-process py-evm chain of eth-tester: zero set-up, for tests and demos."""

    name = "eth-tester"
    GAS_CEILING = 12_000_000

    def __init__(self) -> None:
        from web3 import EthereumTesterProvider

        super().__init__(Web3(EthereumTesterProvider()))
        self.tester = self.w3.provider.ethereum_tester  # type: ignore[attr-defined]

    def estimate_gas(self, tx: dict[str, Any]) -> int:
        # py-evm estimates by binary search (a dozen executions); one eth_call finds a revert
        # and the receipt still reports the gas really used.
        self.w3.eth.call({k: v for k, v in tx.items() if k not in ("nonce", "chainId")})
        return self.GAS_CEILING

    def advance_time(self, seconds: int) -> None:
        self.tester.time_travel(self.now() + int(seconds))

    def snapshot(self) -> Any:
        return self.tester.take_snapshot()

    def revert(self, snapshot_id: Any) -> None:
        self.tester.revert_to_snapshot(snapshot_id)

    def fund(self, address: str, wei: int) -> None:
        rich = self.w3.eth.accounts[0]
        self.w3.eth.wait_for_transaction_receipt(
            self.w3.eth.send_transaction({"from": rich, "to": address, "value": wei})
        )


class RpcBackend(Backend):
    """Any EVM JSON-RPC endpoint; time, snapshots and funding work on anvil (dev nodes)."""

    name = "rpc"

    def __init__(self, url: str, timeout: float = 30.0, receipt_timeout: float = 120.0):
        w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": timeout}))
        super().__init__(w3, receipt_timeout)
        self.url = url

    def _rpc(self, method: str, params: list[Any]) -> Any:
        resp = self.w3.provider.make_request(method, params)  # type: ignore[arg-type]
        if "error" in resp:
            raise ChainError(f"{method}: {resp['error']}")
        return resp.get("result")

    def advance_time(self, seconds: int) -> None:
        self._rpc("evm_increaseTime", [int(seconds)])
        self._rpc("evm_mine", [])

    def snapshot(self) -> Any:
        return self._rpc("evm_snapshot", [])

    def revert(self, snapshot_id: Any) -> None:
        if not self._rpc("evm_revert", [snapshot_id]):
            raise ChainError(f"evm_revert: unknown snapshot {snapshot_id}")

    def fund(self, address: str, wei: int) -> None:
        self._rpc("anvil_setBalance", [address, hex(wei)])

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Poll until the node answers (used after starting a local anvil)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.w3.eth.block_number  # noqa: B018 - a cheap liveness probe
                return
            except Exception as e:
                if time.monotonic() > deadline:
                    raise ChainError(f"node at {self.url} did not answer: {e}") from e
                time.sleep(0.1)
