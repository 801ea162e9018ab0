# over 400 lines: `meshrl chain`'s command table and each command's config beside its few lines of
#  action
"""`meshrl chain ...`: run a local chain, deploy, and the main protocol actions from a shell."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

from pydantic import Field, field_validator

from meshrl.config import Config
from meshrl.protocol.config import ChainConfig, ProtocolParams, RpcFilterConfig, hex_address

__all__ = ["register"]


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


class ChainOnly(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)


class AmountConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    tokens: Decimal = Field(Decimal("100"), ge=0, description="amount in whole tokens")


class MintConfig(AmountConfig):
    to: str = Field("", description="recipient address (federator/minter only)")

    _to = field_validator("to", mode="before")(hex_address)


class PoolConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    domain: str = Field("default", description="domain name (created if new)")
    manager: str = Field("", description="pool manager address (default: the signer)")
    reward_rate: Decimal = Field(Decimal("0.001"), ge=0, description="tokens per work unit")
    max_units: int = Field(1_000_000, ge=1, le=2**64, description="work units a file may claim")
    min_interval: int = Field(
        0, ge=0, le=86400, description="seconds between two submissions of a node (0: none)"
    )
    start: bool = Field(True, description="activate the pool right away")

    _manager = field_validator("manager", mode="before")(hex_address)


class FederatorConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    to: str = Field("", description="proposed federator (empty: cancel a proposal)")

    _to = field_validator("to", mode="before")(hex_address)


class BalancesConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    addresses: list[str] = Field(default_factory=list, description="addresses (default: signer)")

    _addresses = field_validator("addresses", mode="before")(hex_address)


class SendConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    to: str = Field("", description="recipient address")
    ether: Decimal = Field(Decimal("0"), ge=0, description="ether to send (gas for a key that "
                           "signs transactions: a provider and its node both need some)")
    tokens: Decimal = Field(Decimal("0"), ge=0, description="stake tokens to send")

    _to = field_validator("to", mode="before")(hex_address)


class RewardsConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    pool: int = Field(1, ge=1, description="the pool")
    provider: str = Field("", description="the provider (default: the signer)")

    _provider = field_validator("provider", mode="before")(hex_address)


class ClaimConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    pool: int = Field(1, ge=1, description="claim the signer's claimable rewards of this pool")
    batch: int = Field(64, ge=1, le=64, description="most work items per claim transaction: "
                       "fewer when the RPC's bounds (a filter's body and gas caps) take fewer, "
                       "halved on a refusal for size (meshrl.protocol.claiming)")


class KeysNewConfig(Config):
    """`meshrl keys new`: encrypted keystores for a contributor (provider and node by default)."""

    dir: str = Field("keys", description="directory the keystores are written to")
    names: list[str] = Field(["provider", "node"], min_length=1,
                             description="one keystore <dir>/<name>.json per name")
    password_file: str = Field("", description="file holding the password (default: a prompt "
                               "at the terminal, asked twice; never on the command line)")
    force: bool = Field(False, description="overwrite existing keystores (their keys are lost)")
    kdf_iterations: int = Field(0, ge=0, description="tests only: pbkdf2 with this many rounds "
                                "instead of scrypt (0: scrypt)")


class WorksConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    pool: int = Field(1, ge=1, description="the pool whose work to list")


def _work_id(v: object) -> object:
    """A work id on the command line: 32 bytes in hex (0x optional), else a config error."""
    if not isinstance(v, str):
        return v
    h = v.lower().removeprefix("0x")
    if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
        raise ValueError(f"work_id: 32 bytes in hex, not {v!r}")
    return h


class DisputesConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    pool: int = Field(1, ge=1, description="the pool whose verdicts to list")
    open: bool = Field(False, description="only verdicts not settled yet")


class WorkIdConfig(Config):
    chain: ChainConfig = Field(default_factory=ChainConfig)
    work_id: str = Field("", description="the accused work (32 bytes, hex; `meshrl chain "
                         "disputes` lists them)")

    _wid = field_validator("work_id", mode="before")(_work_id)


class VoteConfig(WorkIdConfig):
    uphold: bool = Field(False, description="true: the verdict is right (your own judgment of "
                         "the file finds it invalid too); false: overturn it (also a "
                         "challenge)")


def _print(obj: Any) -> None:
    print(json.dumps(obj, default=str), flush=True)  # a reader of a pipe sees it now


def _handled(name: str, fn: Callable[[Any], int]) -> Callable[[Any], int]:
    """Chain errors (reverts included) become one clear line on stderr and exit status 1."""

    def run(cfg: Any) -> int:
        from meshrl.protocol.errors import ChainError

        try:
            return fn(cfg)
        except ChainError as e:
            print(f"meshrl chain {name}: {e}", file=sys.stderr)
            return 1

    return run


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
            _print({"url": node.url, **public, **dep.__dict__})
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


def _deploy(cfg: DeployConfig) -> int:
    from meshrl.protocol.chain import deploy
    from meshrl.protocol.local import connect, load_account

    dep = deploy(connect(cfg.chain), load_account(cfg.chain), cfg.params)
    dep.save(cfg.chain.deployment)
    _print(dep.__dict__)
    return 0


def _status(cfg: ChainOnly) -> int:
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain, signer=False)
    f = p.contract.functions
    _print(
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


def _register(cfg: AmountConfig) -> int:
    from meshrl.protocol.local import open_protocol, to_base_units

    p = open_protocol(cfg.chain)
    r = p.register_provider(to_base_units(cfg.tokens))
    _print({"provider": p.address, "tx": r.tx_hash, "stake": p.provider().stake})
    return 0


def _stake(cfg: AmountConfig) -> int:
    from meshrl.protocol.local import open_protocol, to_base_units

    p = open_protocol(cfg.chain)
    r = p.add_stake(to_base_units(cfg.tokens))
    _print({"provider": p.address, "tx": r.tx_hash, "stake": p.provider().stake})
    return 0


def _mint(cfg: MintConfig) -> int:
    from meshrl.protocol.local import open_protocol, to_base_units

    p = open_protocol(cfg.chain)
    r = p.mint(cfg.to or p.address, to_base_units(cfg.tokens))
    _print({"to": cfg.to or p.address, "tx": r.tx_hash})
    return 0


def _create_pool(cfg: PoolConfig) -> int:
    from meshrl.protocol.local import open_protocol, to_base_units

    p = open_protocol(cfg.chain)
    domain = p.find_domain(cfg.domain)
    if domain is None:
        domain = p.create_domain(cfg.domain)
    pool = p.create_pool(
        domain, cfg.manager or p.address, to_base_units(cfg.reward_rate), cfg.max_units
    )
    if cfg.min_interval:
        p.set_pool_limits(pool, cfg.max_units, cfg.min_interval)
    if cfg.start:
        p.start_pool(pool)
    _print({"domain": domain, "pool": pool, **p.pool(pool).__dict__})
    return 0


def _propose_federator(cfg: FederatorConfig) -> int:
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain)
    r = p.propose_federator(cfg.to or "0x" + "0" * 40)
    _print({"federator": p.federator(), "proposed": p.pending_federator(), "tx": r.tx_hash})
    return 0


def _accept_federator(cfg: ChainOnly) -> int:
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain)
    r = p.accept_federator()
    _print({"federator": p.federator(), "tx": r.tx_hash})
    return 0


def _balances(cfg: BalancesConfig) -> int:
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain, signer=not cfg.addresses)
    for who in cfg.addresses or [p.address]:
        info = p.provider(who)
        bond, locked = p.bond(who)
        _print(
            {
                "address": who,
                "eth": p.backend.w3.eth.get_balance(who),
                "tokens": p.balance(who),
                "stake": info.stake,
                "unbonding": info.unbonding,
                "compute_units": info.compute_units,
                "bond": bond,
                "bond_locked": locked,
            }
        )
    return 0


def _works(cfg: WorksConfig) -> int:
    from meshrl.protocol.history import pool_history
    from meshrl.protocol.local import open_protocol

    _print(pool_history(open_protocol(cfg.chain, signer=False), cfg.pool))
    return 0


def _disputes(cfg: DisputesConfig) -> int:
    from meshrl.protocol.history import pool_disputes
    from meshrl.protocol.local import open_protocol

    for row in pool_disputes(open_protocol(cfg.chain, signer=False), cfg.pool):
        if not cfg.open or row["outcome"] == "open":
            _print(row)
    return 0


def _on_verdict(cfg: WorkIdConfig, act: str) -> int:
    """challenge / vote / settle one verdict, then print the dispute as it stands."""
    from meshrl.protocol.errors import ChainError
    from meshrl.protocol.local import open_protocol

    if not cfg.work_id:
        raise ChainError(f"{act}: set --work_id")
    p = open_protocol(cfg.chain)
    wid = bytes.fromhex(cfg.work_id)
    if act == "challenge":
        r = p.challenge(wid)
    elif act == "vote":
        r = p.vote(wid, bool(getattr(cfg, "uphold", False)))
    else:
        from meshrl.protocol.chain import SETTLE_GAS

        r = p.settle(wid, SETTLE_GAS)
    d = p.dispute(wid)
    _print({"work_id": cfg.work_id, "action": act, "by": p.address, "tx": r.tx_hash,
            "events": [e.name for e in r.events], "status": int(p.work(wid).status),
            "until": d.until, "challenged": d.challenged, "uphold": d.uphold,
            "overturn": d.overturn})
    return 0


def _challenge(cfg: WorkIdConfig) -> int:
    return _on_verdict(cfg, "challenge")


def _vote(cfg: VoteConfig) -> int:
    return _on_verdict(cfg, "vote")


def _settle(cfg: WorkIdConfig) -> int:
    return _on_verdict(cfg, "settle")


def _rpc_filter(cfg: RpcFilterConfig) -> int:
    from meshrl.protocol.rpc_filter import serve_rpc_filter

    return serve_rpc_filter(cfg)


def _send(cfg: SendConfig) -> int:
    from meshrl.protocol.errors import ChainError
    from meshrl.protocol.local import open_protocol, to_base_units

    if not cfg.to:
        raise ChainError("send: set --to")
    if not cfg.ether and not cfg.tokens:
        raise ChainError("send: set --ether and/or --tokens")
    p = open_protocol(cfg.chain)
    out: dict[str, Any] = {"from": p.address, "to": cfg.to}
    if cfg.ether:
        out["ether_tx"] = p.send_ether(cfg.to, to_base_units(cfg.ether))
    if cfg.tokens:
        out["tokens_tx"] = p.transfer(cfg.to, to_base_units(cfg.tokens)).tx_hash
    out["eth"] = p.backend.w3.eth.get_balance(cfg.to)
    out["token_balance"] = p.balance(cfg.to)
    _print(out)
    return 0


def _rewards(cfg: RewardsConfig) -> int:
    from meshrl.protocol.history import provider_rewards
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain, signer=not cfg.provider)
    _print(provider_rewards(p, cfg.pool, cfg.provider or p.address))
    return 0


def _claim(cfg: ClaimConfig) -> int:
    from meshrl.protocol.claiming import claim_all
    from meshrl.protocol.history import provider_rewards
    from meshrl.protocol.local import open_protocol

    p = open_protocol(cfg.chain)
    view = provider_rewards(p, cfg.pool, p.address)
    ids = [bytes.fromhex(w["work_id"]) for w in view["works"] if w["claimable"]]
    before = p.balance()
    done = claim_all(p, ids, cfg.batch)  # batches sized to the endpoint's bounds
    _print({"provider": p.address, "pool": cfg.pool, "claimed_items": done.items,
            "amount": p.balance() - before, "txs": done.txs, "batch": done.batch,
            "refused_for_size": done.refusals})
    return 0


def _keys_new(cfg: KeysNewConfig) -> int:
    import getpass
    from pathlib import Path

    from eth_account import Account

    from meshrl.config import CommandError
    from meshrl.protocol.keystore import KeystoreError, read_password, write_keystore

    paths = {n: Path(cfg.dir) / f"{n}.json" for n in cfg.names}
    if len(paths) != len(cfg.names) or any(not n or "/" in n for n in cfg.names):
        raise CommandError("keys new: names must be distinct file names")
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not cfg.force:
        raise CommandError(f"keys new: {', '.join(existing)} exist (--force overwrites them, "
                           "and their keys are lost)")
    if cfg.password_file:
        try:
            password = read_password(cfg.password_file, "")
        except KeystoreError as e:
            raise CommandError(str(e)) from None
    elif sys.stdin.isatty():
        password = getpass.getpass("keystore password: ")
        if password != getpass.getpass("again: "):
            raise CommandError("keys new: the passwords differ")
    else:
        raise CommandError("keys new: no terminal to ask a password at: give --password_file")
    if not password:
        raise CommandError("keys new: an empty password protects nothing")
    out: dict[str, Any] = {}
    for name, path in paths.items():
        account = Account.create()
        write_keystore(account, password, path, cfg.kdf_iterations or None)
        out[name] = {"address": account.address, "keystore": str(path)}
    _print(out)
    return 0


def _devnet(cfg: Any) -> int:
    from meshrl.protocol.devnet import setup_devnet

    _print(setup_devnet(cfg))
    return 0


def _compile(cfg: Config) -> int:
    from meshrl.protocol.artifacts import write_artifacts

    for path in write_artifacts():
        _print({"written": str(path)})
    return 0


class CompileConfig(Config):
    pass


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    keys = subparsers.add_parser("keys", help="key files: encrypted keystores")
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    add_config_command(keys_sub, "new", KeysNewConfig, _keys_new,
                       "new keys in encrypted keystores (provider and node by default); the "
                       "password from a prompt or --password_file, never the command line")
    group = subparsers.add_parser("chain", help="protocol contracts: local chain, deploy, act")
    sub = group.add_subparsers(dest="chain_command", metavar="ACTION", required=True)
    add_config_command(
        sub,
        "node",
        NodeConfig,
        _handled("node", _node),
        "start a local anvil on 127.0.0.1, deploy, write the deployment file; "
        "--public_host ADDR serves a filtered public RPC on ADDR (standard methods only)",
    )
    from meshrl.protocol.devnet import DevnetConfig

    add_config_command(sub, "devnet", DevnetConfig, _handled("devnet", _devnet),
                       "local chain only: deploy, fund, mint, validator role, one started pool")
    add_config_command(
        sub,
        "deploy",
        DeployConfig,
        _handled("deploy", _deploy),
        "deploy token + protocol to chain.rpc_url, write the deployment file",
    )
    add_config_command(
        sub,
        "status",
        ChainOnly,
        _handled("status", _status),
        "chain, contracts and protocol totals",
    )
    add_config_command(
        sub,
        "register",
        AmountConfig,
        _handled("register", _register),
        "register the signer as a provider with a stake",
    )
    add_config_command(
        sub, "stake", AmountConfig, _handled("stake", _stake), "add stake as a provider"
    )
    add_config_command(
        sub, "mint", MintConfig, _handled("mint", _mint), "mint tokens (minters only)"
    )
    add_config_command(
        sub,
        "create-pool",
        PoolConfig,
        _handled("create-pool", _create_pool),
        "create (and start) a compute pool, federator only",
    )
    add_config_command(
        sub,
        "propose-federator",
        FederatorConfig,
        _handled("propose-federator", _propose_federator),
        "federator: propose a successor (first step of the hand-over)",
    )
    add_config_command(
        sub,
        "accept-federator",
        ChainOnly,
        _handled("accept-federator", _accept_federator),
        "the proposed account takes over the federator role and the token",
    )
    add_config_command(
        sub,
        "balances",
        BalancesConfig,
        _handled("balances", _balances),
        "ether, token, stake, validator bond (and its locked part) of addresses",
    )
    add_config_command(
        sub,
        "works",
        WorksConfig,
        _handled("works", _works),
        "a pool's work items (status, reward, claimable) and its invalidations, ejections, "
        "claims (one JSON object)",
    )
    add_config_command(sub, "disputes", DisputesConfig, _handled("disputes", _disputes),
                       "a pool's verdicts, one JSON line each: accuser, hard or soft, until "
                       "when disputable, challenged, votes, outcome (open, upheld, overturned)")
    add_config_command(sub, "challenge", WorkIdConfig, _handled("challenge", _challenge),
                       "the accused work's provider disputes the verdict: it then stands only "
                       "if enough other validators uphold it")
    add_config_command(sub, "vote", VoteConfig, _handled("vote", _vote),
                       "a bonded validator re-judges another's open verdict: --uphold true, "
                       "or false to overturn it")
    add_config_command(sub, "settle", WorkIdConfig, _handled("settle", _settle),
                       "anyone: make a verdict final once its dispute period is over "
                       "(slash, or restore the work and pay the validator's bond to the "
                       "provider)")
    add_config_command(sub, "rpc-filter", RpcFilterConfig, _rpc_filter,
                       "a public JSON-RPC endpoint in front of a private node (anvil): "
                       "forwards standard eth_/net_/web3_ methods only, bounded bodies and "
                       "batches")
    add_config_command(sub, "send", SendConfig, _handled("send", _send),
                       "send ether (gas) and/or stake tokens from the signer to --to")
    add_config_command(sub, "rewards", RewardsConfig, _handled("rewards", _rewards),
                       "one provider's work in a pool: earned, claimable, claimed per node "
                       "(reads only that provider's logs, batched)")
    add_config_command(sub, "claim", ClaimConfig, _handled("claim", _claim),
                       "claim every claimable reward of the signer in a pool")
    add_config_command(
        sub,
        "compile",
        CompileConfig,
        _handled("compile", _compile),
        "recompile the Vyper contracts into contracts/compiled/*.json",
    )
