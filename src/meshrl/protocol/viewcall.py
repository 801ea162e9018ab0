"""View calls encoded once per function, for `Backend.call_many`.

web3 encodes each contract call by looking its function up again in the whole ABI and checking
every entry, which hashes every function's signature per call: 2,403 reads of a 200-step pool
(`meshrl chain works`) took 15 s of CPU, most of it `function_abi_to_4byte_selector`, and a
stopping pool's report gave up before it. Here a function's selector and types are worked out
once, each call is `selector ‖ abi.encode(args)`, and an answer is decoded as web3 would hand it
back (one output unwrapped, structs as tuples, addresses checksummed). Functions with an array
or nested-struct type go through web3 unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import eth_abi
from eth_utils import function_abi_to_4byte_selector, to_checksum_address

__all__ = ["ViewCall", "view_call"]

_ELEMENTARY = ("uint", "int", "bool", "bytes", "string", "address")


def _flat(t: str) -> bool:
    return "[" not in t and t.startswith(_ELEMENTARY)


def _type(entry: dict[str, Any]) -> str | None:
    """The ABI type of an input or output, a struct of elementary types written as a tuple;
    None for an array or a struct inside a struct."""
    if entry["type"] == "tuple":
        inner = [c["type"] for c in entry.get("components", [])]
        return f"({','.join(inner)})" if all(_flat(t) for t in inner) else None
    return entry["type"] if _flat(entry["type"]) else None


class ViewCall:
    """One function's encoder and decoder."""

    def __init__(self, abi: dict[str, Any]) -> None:
        self.selector = function_abi_to_4byte_selector(abi)
        self.inputs = [_type(i) for i in abi["inputs"]]
        self.outputs = [_type(o) for o in abi.get("outputs", [])]
        self.ok = None not in self.inputs and None not in self.outputs

    def data(self, args: tuple[Any, ...]) -> bytes:
        return self.selector + eth_abi.encode(self.inputs, list(args))  # type: ignore[arg-type]

    def decode(self, raw: bytes) -> Any:
        got = [_normal(t, v) for t, v in zip(  # type: ignore[arg-type]
            self.outputs, eth_abi.decode(self.outputs, bytes(raw)), strict=True)]  # type: ignore[arg-type]
        return got[0] if len(got) == 1 else got


def _normal(t: str, v: Any) -> Any:
    if t == "address":
        return to_checksum_address(v)
    if t.startswith("("):
        return tuple(_normal(s, x) for s, x in zip(t[1:-1].split(","), v, strict=True))
    return v


@lru_cache(maxsize=512)
def _codec(abi_json: str) -> ViewCall:
    return ViewCall(json.loads(abi_json))


def view_call(fn: Any) -> tuple[dict[str, Any], Callable[[bytes], Any]] | None:
    """The eth_call transaction of a bound contract function (`contract.functions.f(args)`)
    and the decoder of its answer; None where web3 must do it (`plain`)."""
    abi = getattr(fn, "abi", None)
    if not isinstance(abi, dict):
        return None
    codec = _codec(json.dumps(abi, sort_keys=True))
    if not codec.ok:
        return None
    return {"to": fn.address, "data": "0x" + codec.data(tuple(fn.args)).hex()}, codec.decode
