"""A remote member is not wasted: over a 20 Mbit/s, 80 ms round-trip link (two network
namespaces, tests/linkrelay.py), a stranger who joins a public pool with the documented command
loses at most 5% of its accepted files to staleness, with the pool's defaults for a public pool
(configs/network.toml with `public_host`: no async_level or broadcast override here).

The share is the trainer's own record (`rollouts.jsonl`): of the stranger's accepted files the
trainer took, those it dropped as stale; and the stranger is not wasted by being given no work
either: its files are at least 5% of those the trainer used. Marked `crosshost` (and
`slow`): minutes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import netutil as nu
import pytest
from test_cross_host import ROOT, Stranger, _accepted, _fund, _in, _lines, hosts  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from linkrelay import Link

# Before the fix (issue #43, 2 shared cores): with async_level 2 and full checkpoints the remote
# member was given no work at all in 4.4 minutes; with async_level 24 and the pacing demand
# tied to it (48 files queued ahead) 43 of the 47 of its files the trainer took were stale.
# With a public pool's defaults (async_level 24, a queue of at most 2 batches, work orders
# sized by each member's measured lag): 41 of its files taken, none stale, 11% of the pool's;
# with the demo's rollout shape (below), since the engine got faster: none stale, 8.5-8.8%.
pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.crosshost,
              pytest.mark.timeout(1500)]

TAKEN = 40  # of the stranger's accepted files the trainer took (used or dropped)
MAX_STALE_SHARE = 0.05
# nor wasted by being given no work: of the files the trainer used, at least this share is the
# stranger's (one of 3 members, the slowest: 8.5% and 8.8% measured)
MIN_USED_SHARE = 0.05


def _taken(root: Path, node: str) -> dict[str, int]:
    """The stranger's files in the trainer's records: used, dropped stale, dropped otherwise."""
    path = root / "trainer" / "rollouts.jsonl"
    out = {"used": 0, "stale": 0, "other": 0}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        out["used"] += sum(f["node"].lower() == node.lower() for f in rec["used"])
        for d in rec["dropped"]:
            if d["node"].lower() == node.lower():
                out["stale" if d.get("reason") == "stale" else "other"] += 1
    return out


def test_a_remote_member_loses_at_most_5_percent_to_staleness(hosts, tmp_path) -> None:  # noqa: F811
    ns, addr = hosts, hosts.addr
    port = 24000 + (os.getpid() % 100) * 20
    cfg = tmp_path / "net.toml"
    # the demo's pool (configs/network.toml) opened to another host, with its rollout shape
    # (files of 16 prompts, 64 a step): the short networks' (4 and 8) made 3-4 versions a
    # second, so that the remote member, on its 20 Mbit/s link, spent its time fetching them
    # and made 5-7% of the files used (9.5% of its own stale in one run of three); two local
    # members keep the pace, the training runs on for longer than the test
    cfg.write_text(nu.short_network(
        "stale", steps=5000, checkpoint_every=50, workers="honest = 2\ndishonest = 0",
        prompts_per_step=64, prompts_per_file=16,
        top=f'public_host = "{addr}"\nmax_minutes = 30\ndashboard = false\nrelays = 1'
    ).replace("{port}", str(port)))
    up_log = tmp_path / "up.log"
    up = _in(ns.pool, "-m", "meshrl.cli", "network", "up", str(ROOT / "configs" / "network.toml"),
             str(cfg), "--dir", str(tmp_path), log=up_log)
    root = tmp_path / "stale"
    public = [port + off for off in (1, 2, 3, 4, 14)]  # discovery, orch, origin, relay, rpc
    link = Link([((addr, p), (addr, p)) for p in public], delay_s=0.04, rate_bps=20e6,
                listen_ns=ns.path(ns.worker), connect_ns=ns.path(ns.pool)).start()
    a: Stranger | None = None
    t0 = time.monotonic()
    try:
        (tmp_path / "pw").write_text("far away\n")
        a = Stranger(ns, tmp_path, "remote", f"http://{addr}:{port + 2}",
                     f"http://{addr}:{port + 14}")
        nu.wait(lambda: any(e["event"] == "start" and e.get("role") == "worker-0"
                            for e in nu.events(root)) or up.poll() is not None, 600,
                "the pool did not start", every=1.0)
        assert up.poll() is None, up_log.read_text()[-3000:]
        a.join()
        nu.wait(lambda: any(x.startswith("fund on chain") for x in _lines(a.log))
                or not a.alive(), 180, "the stranger did not ask for funds")
        assert a.alive(), a.tail()
        _fund(ns, root, port, a)
        nu.wait(lambda: _accepted(ns, root, a.node), 600, "no file of the stranger accepted",
                every=2.0)
        t_first = time.monotonic()
        nu.wait(lambda: sum(_taken(root, a.node).values()) >= TAKEN or not a.alive()
                or up.poll() is not None, 900, "the trainer took too few of the stranger's "
                f"files: {_taken(root, a.node)}", every=3.0)
        assert a.alive(), a.tail()
    finally:
        if a is not None and a.alive():
            a.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            try:
                a.proc.wait(60)  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                a.proc.kill()  # type: ignore[union-attr]
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            try:
                up.wait(180)
            except subprocess.TimeoutExpired:
                up.kill()
        link.close()
    got = _taken(root, a.node)
    records = [json.loads(x) for x in (root / "trainer" / "rollouts.jsonl").read_text()
               .splitlines() if x.strip()]
    stale_all = sum(d.get("reason") == "stale" for r in records for d in r["dropped"])
    taken_all = sum(len(r["used"]) + len(r["dropped"]) for r in records)
    share = got["stale"] / max(1, sum(got.values()))
    used_all = sum(len(r["used"]) for r in records)
    print(json.dumps({"remote": got, "remote_stale_share": round(share, 3),
                      "remote_share_of_used": round(got["used"] / max(1, used_all), 3),
                      "pool_stale": stale_all, "pool_taken": taken_all,
                      "steps": len(records), "link_bytes": link.bytes,
                      "seconds_after_first_accepted": round(time.monotonic() - t_first),
                      "test_s": round(time.monotonic() - t0)}))
    assert sum(got.values()) >= TAKEN, got
    assert share <= MAX_STALE_SHARE, got
    assert got["used"] >= MIN_USED_SHARE * used_all, (got, used_all)
