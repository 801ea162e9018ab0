"""One chain, one discovery and one orchestrator process for the module's tests; n1 and n2 are
onboarded members kept alive by a heartbeat thread."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from .net import Chain, Heartbeater, Service, hexkey, onboard, run, start_chain


@dataclass
class Pool:
    chain: Chain
    disc: Service
    orch: Service
    tmp: Path

    def key(self, name: str) -> str:
        return hexkey(self.chain.accounts[name])


_COUNTERS = itertools.count()


def next_counter() -> int:
    """A counter no other file of this test process used (the orchestrator grants each
    (node, version, counter) one file)."""
    return next(_COUNTERS)


def parquet_framed(payload: bytes) -> bytes:
    """`payload` framed as Parquet (magic first and last, a footer length that fits): what the
    store's cheap format check lets through."""
    return b"PAR1" + payload + len(payload).to_bytes(4, "little") + b"PAR1"


def orchestrator_config(chain: Chain, tmp: Path, **over: object) -> dict:
    cfg: dict = {
        "port": 0, "pool_id": chain.pool, "db": str(tmp / "orch.db"),
        "readers": [chain.accounts["trainer"].address], "chain_poll_s": 0.2,
        "validator_cache_s": 0.0,
        "chain": {"deployment": str(chain.deployment), "rpc_url": chain.node.url,
                  "private_key": hexkey(chain.accounts["mgr"])},
        "guard": {"rate_per_minute": 3000, "rate_burst": 40},
        "store": {"root": str(tmp / "files")},
        "heartbeat": {"interval_s": 1.0, "dead_after": 3},
        "onboarding": {"poll_s": 0.2, "recheck_s": 0.5, "requirements": {"min_cores": 4}},
        "work": {"step": 3, "max_file_bytes": 1 << 21, "max_units_per_file": 10_000,
                 "slot_ttl_s": 30.0, "stall_log_s": 1.0},
        # many files of one node at one step in these tests: each takes a counter of its own
        "rules": {"async_level": 1, "group_size": 2, "files_per_step": 1 << 12},
    }
    for k, v in over.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) else v
    return cfg


@contextmanager
def pool_services(tmp: Path, members: tuple[tuple[str, str], ...],
                  **over: object) -> Iterator[Pool]:
    """A chain, a discovery and an orchestrator process in `tmp`, with each (node, provider)
    of `members` onboarded into the pool; `over` changes the orchestrator's config as
    `orchestrator_config` does; everything stopped afterwards (for tests marked `anvil`)."""
    chain = start_chain(tmp)
    disc = Service("discovery", {
        "port": 0, "db": str(tmp / "disc.db"), "sync_s": 0.5, "manager_cache_s": 0.0,
        "chain": {"deployment": str(chain.deployment), "rpc_url": chain.node.url}}, tmp)
    orch: Service | None = None
    try:
        disc.start()
        cfg = orchestrator_config(chain, tmp, **over)
        cfg["onboarding"] = {**cfg["onboarding"], "discovery_url": disc.url}
        orch = Service("orchestrator", cfg, tmp)
        orch.start()
        for node, provider in members:
            run(onboard(chain, disc.url, orch.url, node, provider))
        yield Pool(chain, disc, orch, tmp)
    finally:
        if orch is not None:
            orch.stop()
        disc.stop()
        chain.close()


@pytest.fixture(scope="package")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    with pool_services(tmp_path_factory.mktemp("pool"), (("n1", "p1"), ("n2", "p1"))) as p:
        beats = Heartbeater(p.orch.url, [p.key("n1"), p.key("n2")], every=0.3)
        try:
            yield p
        finally:
            beats.stop()
