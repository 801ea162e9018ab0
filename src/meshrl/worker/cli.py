"""`meshrl worker` (light imports only: torch loads after the command line is parsed)."""

from __future__ import annotations

from typing import Any

from meshrl.worker.config import JoinConfig, WorkerConfig

__all__ = ["register", "run_worker"]


def _worker(cfg: WorkerConfig) -> int:
    from meshrl.config import InputError

    if cfg.cheat.mode != "none":
        raise InputError(f"cheat.mode = {cfg.cheat.mode!r} runs only as `meshrl adversary "
                           "worker` (tests and demos of the validator): `meshrl worker` is honest")
    return run_worker(cfg)


def run_worker(cfg: WorkerConfig, parts: Any = None) -> int:
    """`meshrl worker`'s work: the node with `parts` (None: the honest ones) until it stops;
    an expected failure becomes one line."""
    import asyncio

    from meshrl.config import EXIT_REFUSED, CommandError
    from meshrl.pool import PoolRulesError
    from meshrl.protocol.errors import ChainError
    from meshrl.protocol.local import connect
    from meshrl.wire import WireHTTPError
    from meshrl.wire.detached import exit_now
    from meshrl.worker.join import JoinError
    from meshrl.worker.keys import KeystoreError, load_keys
    from meshrl.worker.node import HardwareError, WorkerNode
    from meshrl.worker.onboard import Blacklisted, OnboardError

    try:
        keys = load_keys(cfg.keys, connect(cfg.chain).chain_id)
        rc = asyncio.run(WorkerNode(cfg, keys, parts).run())
        exit_now(rc)  # a generation or chain read a stop abandoned is not waited for
        return rc
    except (Blacklisted, PoolRulesError) as e:  # for good: a supervisor must not restart it
        raise CommandError(str(e), EXIT_REFUSED) from None
    except (KeystoreError, HardwareError, ChainError, OnboardError, WireHTTPError,
            JoinError) as e:
        raise CommandError(str(e)) from None  # one line, not a traceback


async def _join_and_work(cfg: JoinConfig) -> int:
    import asyncio
    import signal
    from pathlib import Path

    from meshrl.log import get_logger, log_event
    from meshrl.protocol import Protocol
    from meshrl.protocol.config import ChainConfig
    from meshrl.protocol.local import connect
    from meshrl.worker import join as j
    from meshrl.worker.hardware import missing, probe
    from meshrl.worker.keys import load_keys
    from meshrl.worker.node import HardwareError, WorkerNode

    log = get_logger("meshrl.worker")
    if not cfg.url:
        raise j.JoinError("give the pool's URL: meshrl worker join http://HOST:PORT")
    lacking = missing(probe(cfg.work_dir, cfg.hardware.python_packages), cfg.hardware)
    if lacking:
        raise HardwareError("this machine does not meet the requirements: " + "; ".join(lacking))
    pin = j.load_pin(cfg.pin_deployment)
    m, offset = await j.fetch_manifest(cfg.url)
    j.check_clock(offset, m.signature_window_s, cfg.clock_margin_s)
    if not cfg.chain.rpc_url:  # the pool's RPC would answer for the pool: never trusted
        raise j.JoinError(f"give an RPC of chain {m.chain_id} that you trust: --chain.rpc_url "
                          f"URL (the pool suggests {m.rpc_url or 'none'}; it checks nothing "
                          "unless you choose to trust it)")
    backend = await asyncio.to_thread(connect, ChainConfig(
        rpc_url=cfg.chain.rpc_url, rpc_timeout_s=cfg.chain.rpc_timeout_s,
        ready_timeout_s=cfg.chain.ready_timeout_s))
    m = await asyncio.to_thread(j.confirm_pool, backend, m, pin, cfg.pin_protocol)
    keys = load_keys(cfg.keys, m.chain_id)
    dep = j.deployment_of(m)
    path = Path(cfg.work_dir) / "deployment.json"
    dep.save(path)
    log_event(log, "pool confirmed by own RPC", pool=m.pool_id, chain=m.chain_id,
              rpc=cfg.chain.rpc_url, protocol=m.protocol, token=m.token, signer=m.signer,
              clock_offset_s=round(offset, 2), provider=keys.provider.address,
              node=keys.node.address)
    chain = Protocol(backend, dep)
    funding = await asyncio.to_thread(j.funding_needed, chain, keys, cfg, m)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    funded = await j.wait_funded(chain, funding, m, cfg, stop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.remove_signal_handler(sig)
    if not funded:
        if stop.is_set():
            return 0
        raise j.JoinError(f"not funded within {cfg.fund_timeout_s} s")
    return await WorkerNode(j.joined_config(cfg, m, path), keys).run()


def _join(cfg: JoinConfig) -> int:
    import asyncio

    from meshrl.config import EXIT_REFUSED, CommandError
    from meshrl.pool import PoolRulesError
    from meshrl.protocol.errors import ChainError
    from meshrl.wire import WireHTTPError
    from meshrl.wire.detached import exit_now
    from meshrl.worker.join import JoinError
    from meshrl.worker.keys import KeystoreError
    from meshrl.worker.node import HardwareError
    from meshrl.worker.onboard import Blacklisted, OnboardError

    try:
        rc = asyncio.run(_join_and_work(cfg))
        exit_now(rc)  # a claim's chain read a stop abandoned is not waited for
        return rc
    except (Blacklisted, PoolRulesError) as e:
        raise CommandError(str(e), EXIT_REFUSED) from None
    except (JoinError, KeystoreError, HardwareError, ChainError, OnboardError,
            WireHTTPError) as e:
        raise CommandError(str(e)) from None


def register(subparsers: Any) -> None:
    from meshrl.config import add_config_command

    add_config_command(subparsers, "worker", WorkerConfig, _worker,
                       "generate verified rollouts for a compute pool and earn its rewards "
                       "(a stranger: `meshrl worker join URL`)")
    add_config_command(subparsers, "worker-join", JoinConfig, _join,
                       "meshrl worker join URL: join a pool from anywhere by its orchestrator's "
                       "URL: hardware, manifest, clock and contracts checked, funds awaited, "
                       "then stake, join and work", positional="url")
