"""Bringing a chain up and looking at it: a local node (and its public RPC filter), a devnet,
a deployment to any chain, the contracts recompiled, and the status of what is deployed."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import Field, field_validator

from meshrl.config import Config
from meshrl.protocol.cli.common import ChainOnly, Command, emit
from meshrl.protocol.config import ChainConfig, ProtocolParams, RpcFilterConfig
from meshrl.protocol.devnet import DevnetConfig

__all__ = ["COMMANDS"]


class NodeConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    params: ProtocolParams = Field(default_factory=ProtocolParams)
    port: int = Field(8545, description="port of the local anvil on 127.0.0.1")
    anvil: str = Field("", description="anvil binary (default: node_modules/.bin, then PATH)")
    run_seconds: float = Field(0.0, description="stop after this long (0: until interrupted)")
    public_host: str = Field("", description="an address of this host that others reach: the "
                             "chain's public RPC listens there through the RPC filter "
                             "(standard methods only); anvil itself stays on 127.0.0.1 "
                             "(empty: no public RPC)")
    public_port: int = Field(0, ge=0, le=65535, description="port of the public RPC on "
                             "public_host (0: port + 1)")

    @field_validator("public_host")
    @classmethod
    def _routable(cls, v: str) -> str:
        if v in ("0.0.0.0", "::", "[::]"):
            raise ValueError("public_host: name the address others reach, not a wildcard")
        return v


class DeployConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    params: ProtocolParams = Field(default_factory=ProtocolParams)


class CompileConfig(Config):
    pass


@contextmanager
def _sigterm_exits() -> Iterator[None]:
    """While the block runs, SIGTERM (e.g. from a supervisor) is a normal exit, so `finally`
    clauses (stopping anvil) run; then the caller's handler is back. A command called in-process
    must not change its host's signal handling for good. Off the main thread Python cannot
    handle signals: nothing is installed."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        yield
    finally:  # None: the handler was not set from Python; the default is the closest
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _node(cfg: NodeConfig) -> int:
    import time

    from meshrl.config import CommandError
    from meshrl.log import get_logger, log_event
    from meshrl.protocol.local import start_local_chain
    from meshrl.protocol.rpc_filter import filter_in_thread

    log = get_logger("meshrl.protocol.node")
    stop_filter = None
    with _sigterm_exits():
        node, dep = start_local_chain(
            cfg.port, cfg.params, cfg.chain.deployment, cfg.anvil, cfg.chain.private_key
        )
        start = time.monotonic()
        try:  # from here on anvil is ours to stop, whenever SIGTERM lands (even mid-print)
            public: dict[str, str] = {}
            if cfg.public_host:  # the public face: the filter, never anvil itself
                try:
                    filt, stop_filter = filter_in_thread(RpcFilterConfig(
                        upstream=node.url, host=cfg.public_host,
                        port=cfg.public_port or cfg.port + 1))
                except OSError as e:
                    raise CommandError(f"chain node: {e}") from None
                public["public_rpc_url"] = filt.url
            log_event(log, "chain ready", url=node.url, deployment=cfg.chain.deployment,
                      protocol=dep.protocol, token=dep.token, **public)
            emit({"url": node.url, **public, **dep.__dict__})
            while node.proc is not None and node.proc.poll() is None:
                if cfg.run_seconds and time.monotonic() - start >= cfg.run_seconds:
                    break
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        finally:
            if stop_filter is not None:
                stop_filter()
            node.stop()
            log_event(log, "chain stopped", url=node.url)
    return 0


def _devnet(cfg: Any) -> int:
    from meshrl.protocol.devnet import setup_devnet

    emit(setup_devnet(cfg))
    return 0


def _deploy(cfg: DeployConfig) -> int:
    from meshrl.protocol.chain import deploy
    from meshrl.protocol.local import connect, load_account

    dep = deploy(connect(cfg.chain), load_account(cfg.chain), cfg.params)
    dep.save(cfg.chain.deployment)
    emit(dep.__dict__)
    return 0


def _status(cfg: ChainOnly) -> int:
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain, signer=False)
    f = p.contract.functions
    emit(
        {
            "chain_id": p.backend.chain_id,
            "block": p.backend.block_number(),
            "protocol": p.contract.address,
            "token": p.token.address,
            "federator": p.federator(),
            "domains": p.backend.call(f.domain_count()),
            "pools": p.backend.call(f.pool_count()),
            **p.totals(),
        }
    )
    return 0


def _rpc_filter(cfg: RpcFilterConfig) -> int:
    from meshrl.protocol.rpc_filter import serve_rpc_filter

    return serve_rpc_filter(cfg)


def _compile(cfg: Config) -> int:
    from meshrl.protocol.artifacts import write_artifacts

    for path in write_artifacts():
        emit({"written": str(path)})
    return 0


COMMANDS = (
    Command("node", NodeConfig, _node,
            "start a local anvil on 127.0.0.1, deploy, write the deployment file; "
            "--public_host ADDR serves a filtered public RPC on ADDR (standard methods only)"),
    Command("devnet", DevnetConfig, _devnet,
            "local chain only: deploy, fund, mint, validator role, one started pool"),
    Command("deploy", DeployConfig, _deploy,
            "deploy token + protocol to chain.rpc_url, write the deployment file"),
    Command("status", ChainOnly, _status, "chain, contracts and protocol totals"),
    # a proxy: it makes no chain call of its own whose error to report
    Command("rpc-filter", RpcFilterConfig, _rpc_filter,
            "a public JSON-RPC endpoint in front of a private node (anvil): forwards standard "
            "eth_/net_/web3_ methods only, bounded bodies and batches", chain_errors=False),
    Command("compile", CompileConfig, _compile,
            "recompile the Vyper contracts into contracts/compiled/*.json"),
)
