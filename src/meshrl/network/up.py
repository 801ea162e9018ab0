"""`meshrl network up`: start a whole pool on loopback and supervise it until the trainer
finishes (or Ctrl-C, or `max_minutes`).

Keys first, before anything starts (`network/keys.py`): dev keys for a loopback demo, the
run's own for a pool opened to other hosts, which refuses any key of anvil's public mnemonic.

Order: anvil (its state dumped to `chain/anvil-state.json` every 2 s and on exit, so a second
`up` resumes the same chain), `meshrl chain devnet` (skipped when the chain already has the
contracts), discovery, orchestrator, the shardcast origin and relays, the trainer, the
validators (`validators.count`, splitting the files; docs/protocol.md), the workers. Every
role keeps its state under `runs/<name>/`, so starting the same network again resumes it: the
chain from its state file, the services from SQLite, the trainer from its newest checkpoint,
workers from their outboxes and each validator from its cursor.

Ctrl-C (or SIGTERM) in any phase ends the network within `STOP_S` seconds: every wait of the
supervisor watches it (a role's health, the chain set-up, supervision), then the roles that use
the services stop (SIGTERM, `CLIENT_GRACE_S` together), the report is written with what answers
until `REPORT_BY_S` after the signal, and the services and the chain stop last. events.jsonl
records the signal (`interrupt`), each role's `stopped` (its seconds; rc -9: it had to be
killed) and the whole stop (`network stopped`, `stop_s` from the signal).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from meshrl.log import get_logger, log_event
from meshrl.network.closing import drain, mine
from meshrl.network.config import NetworkConfig
from meshrl.network.faults import Faults
from meshrl.network.keys import PoolKeys
from meshrl.network.launcher import RoleLauncher
from meshrl.network.report import write_report
from meshrl.network.roles import Layout, anvil_role, build_roles, devnet_argv, validator_name
from meshrl.network.status import UpStatus
from meshrl.network.supervisor import RoleFailed, StopRequested, Supervisor

__all__ = ["CLIENT_GRACE_S", "REPORT_BY_S", "STOP_S", "network_up", "where_to_look"]

log = get_logger("meshrl.network")
STOP_S = 15.0  # a Ctrl-C ends the network within this long, whatever its phase
CLIENT_GRACE_S = 5.0  # workers, validators and the trainer: SIGTERM, then this long together
REPORT_BY_S = 8.0  # the report reads what answers until this long after the signal (the
# services and anvil get the rest of STOP_S; its chain reads take 3 s after a 200-step pool)
SERVICE_GRACE_S = 2.0  # at least, each later tier: the services, then the chain
DRAIN_GRACE_S = 20.0  # a draining pool stops the roles that take work without hurry


def network_up(cfg: NetworkConfig) -> int:
    lay = Layout(cfg)
    lay.root.mkdir(parents=True, exist_ok=True)
    # before anything starts: a pool opened to other hosts refuses well-known keys
    keys = lay.keys()
    launcher = RoleLauncher(fork=cfg.fork_roles)
    launcher.warm()  # its imports overlap anvil's start and the chain's set-up
    sup = Supervisor(lay.root, cfg.restart_backoff_s, cfg.max_fast_deaths, launcher)
    interrupted: list[tuple[int, float]] = []  # (signal, when): written to events.jsonl later

    def on_signal(signum: int, _frame: Any) -> None:
        interrupted.append((signum, time.monotonic()))

    serving: list[float] = []  # when a network kept serving after training began to

    def hurried() -> bool:
        # a stop is cut to STOP_S, in every phase, the report's included; only one of a
        # network kept serving after its trainer finished (`after_training = "serve"`) is the
        # end of the run, and its report is written whole: a few seconds, more when loaded
        return bool(interrupted) and not (serving and interrupted[0][1] >= serving[0])

    def give_up() -> bool:  # the report's reads end by REPORT_BY_S after a hurried signal
        return hurried() and time.monotonic() > interrupted[0][1] + REPORT_BY_S

    sup.should_stop = lambda: bool(interrupted)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    status = UpStatus(lay.root)
    status.header(where_to_look(lay))
    quiet = logging.getLogger("meshrl")
    level = quiet.level
    if status.enabled:  # the status line instead of JSON lines (events.jsonl keeps them)
        quiet.setLevel(logging.WARNING)
    t0 = time.monotonic()
    outcome, failed, reported = "interrupted", False, False
    faults: Faults | None = None
    try:
        sup.start(anvil_role(lay))
        pool = _devnet(sup, lay, keys)
        roles = build_roles(lay, keys, pool)
        faults = Faults(cfg.faults, [r.name for r in roles])
        _write_network_file(lay, keys, pool, [r.name for r in roles])
        for spec in roles:
            if interrupted:
                break
            sup.start(spec)
        while not interrupted:
            finished = sup.poll()
            faults.tick(sup)
            status.tick(sup.procs)
            if "trainer" in finished:
                outcome = "trained"
                if cfg.after_training == "stop":
                    break
                serving.append(time.monotonic())
            late = cfg.max_minutes and time.monotonic() - t0 > 60 * cfg.max_minutes
            if late and outcome != "trained":
                outcome = "time limit"
                break
            time.sleep(0.5)
        if cfg.on_stop == "drain" and (lay.root / "network.json").is_file():
            status.end()
            _report(cfg, lay, _never)  # while the orchestrator still answers
            reported = True
            outcome += f"; {_drain(cfg, lay, sup, status, interrupted)}"
    except StopRequested:
        pass  # a Ctrl-C while a role started or the chain was set up
    except (RoleFailed, ValueError) as e:
        outcome, failed = f"failed: {e}", True
        log_event(log, "role failed", error=str(e))
    finally:
        status.end()
        quiet.setLevel(level)
        if interrupted:
            sig, when = interrupted[0]
            sup.event("interrupt", "supervisor", signal=signal.Signals(sig).name,
                      noticed_s=round(time.monotonic() - when, 2))
        sup.write_cpu(lay.root / "cpu.json")
        # the roles that use the services first: the trainer's last metrics and checkpoint,
        # the workers' outboxes and the validators' verdicts are on disk for the report
        sup.stop_roles(sup.clients(), CLIENT_GRACE_S)
        if faults is not None:
            faults.write(lay.root / "faults.json")
        _write_outcome(lay, outcome, time.monotonic() - t0)
        # while the orchestrator and the chain still answer; after a signal, given up to
        # REPORT_BY_S + 1 s in all (its reads stop at REPORT_BY_S; imports and parsing on a
        # loaded machine took 6 s more), then the stop goes on without it
        report = threading.Thread(target=_report, args=(cfg, lay, give_up), daemon=True)
        if not reported:
            report.start()
        while report.is_alive():
            report.join(0.1)
            if hurried() and time.monotonic() > interrupted[0][1] + REPORT_BY_S + 1.0:
                log_event(log, "report cut short", by_s=REPORT_BY_S + 1.0)
                break
        # the services get what is left of STOP_S (2 s kept for anvil and this process's exit)
        left = interrupted[0][1] + STOP_S - 2.0 - time.monotonic() if hurried() else 10.0
        sup.stop_all(max(SERVICE_GRACE_S, left))
        if interrupted:
            sup.event("network stopped", "supervisor", outcome=outcome,
                      stop_s=round(time.monotonic() - interrupted[0][1], 2))
        sup.close()
        status.header({"stopped": f"{outcome}; report {lay.root / 'report.md'}"})
        for s, h in old.items():
            signal.signal(s, h)
    return 1 if failed else 0


# roles that take work; a draining pool stops them first and keeps the chain, its public RPC,
# the dashboard and its own workers (who claim) up
def _takes_work(name: str) -> bool:
    return name in ("trainer", "orchestrator", "discovery", "origin") or name.startswith(
        ("validator", "relay-"))


def _drain(cfg: NetworkConfig, lay: Layout, sup: Supervisor, status: UpStatus,
           interrupted: list[tuple[int, float]]) -> str:
    """`on_stop = "drain"` (closing.py): stop taking work, keep the chain up until every
    reward is claimed or has been claimable `claim_window_s`; a further signal stops it."""
    signals = len(interrupted)
    sup.stop_roles([p for n, p in sup.procs.items() if _takes_work(n)], DRAIN_GRACE_S)
    info = json.loads((lay.root / "network.json").read_text())

    def say(what: str, fields: dict[str, Any]) -> None:
        sup.event(what, "network", **fields)
        status.header({what: json.dumps(fields)})

    def read() -> dict[str, Any] | None:
        from meshrl.network.report import works_history

        return works_history(info)

    # a file submitted just before the stop unlocks `lock_period` later; the cap bounds a
    # drain whose chain keeps moving the last unlock (it cannot: nothing takes work now)
    max_s = cfg.chain.lock_period + cfg.claim_window_s + 600
    mined = [0.0]

    def tick() -> None:
        sup.poll()
        if time.monotonic() - mined[0] >= 2.0:  # the chain's clock moves on (closing.mine)
            mined[0] = time.monotonic()
            mine(lay.rpc_url)

    return drain(read, cfg.claim_window_s, max_s, lambda: len(interrupted) > signals, say,
                 tick)


def where_to_look(lay: Layout) -> dict[str, str]:
    """What `network up` prints first. The join URL is the orchestrator's own URL, the one
    `meshrl worker join URL` takes (it reads `URL/join` itself), as docs/joining.md says."""
    return {"dashboard": lay.dashboard_url if lay.cfg.dashboard else "",
            "join": lay.orchestrator_url if lay.public else "",
            "logs": str(lay.root / "logs"), "events": str(lay.root / "events.jsonl")}


def _never() -> bool:
    return False


def _report(cfg: NetworkConfig, lay: Layout, give_up: Any) -> None:
    if not (lay.root / "network.json").is_file():
        return
    try:
        rep = write_report(cfg, lay.root, give_up)
        log_event(log, "report", path=str(lay.root / "report.md"), accuracy=rep["accuracy"])
    except Exception as e:  # a report must never keep the network from stopping
        log_event(log, "report failed", error=f"{type(e).__name__}: {e}")


def _devnet(sup: Supervisor, lay: Layout, keys: PoolKeys) -> int:
    """The chain set-up (`meshrl chain devnet`), ended by a Ctrl-C like every other wait."""
    try:
        out = sup.run_once("devnet", devnet_argv(lay, keys))
    except RoleFailed:
        raise RoleFailed(f"chain set-up failed; see {lay.root / 'logs' / 'devnet.log'}") \
            from None
    info = json.loads(out.decode().strip().splitlines()[-1])
    log_event(log, "chain ready", **info)
    return int(info["pool_id"])


def _write_network_file(lay: Layout, keys: PoolKeys, pool: int, roles: list[str]) -> None:
    """`network.json`: where everything is, for the dashboard, tests and people."""
    workers = {name: {"provider": keys.provider(i).address, "node": keys.node(i).address,
                      "dishonest": bad} for name, i, bad in lay.workers()}
    info = {"pool_id": pool, "reward_rate": lay.cfg.pool.reward_rate, "rpc_url": lay.rpc_url,
            "public_rpc_url": lay.public_rpc_url,
            "deployment": str(lay.deployment),
            "discovery": lay.discovery_url, "orchestrator": lay.orchestrator_url,
            "origin": lay.origin_url, "relays": lay.relay_urls(), "roles": roles,
            "dashboard": lay.dashboard_url if lay.cfg.dashboard else None,
            "workers": workers, "validator": keys.validator().address,
            "validators": {validator_name(j): {
                "address": keys.validator(j).address,
                "rogue": j >= lay.cfg.validators.count - lay.cfg.validators.rogue}
                for j in range(lay.cfg.validators.count)},
            "manager": keys.manager().address, "trainer": keys.trainer().address,
            "federator": keys.federator().address, "keys": keys.source,
            "trainer_key_file": str(keys.key_file("trainer")),
            "trainer_dir": str(lay.root / "trainer")}
    (lay.root / "network.json").write_text(json.dumps(info, indent=1))


def _write_outcome(lay: Layout, outcome: str, seconds: float) -> None:
    path = lay.root / "outcome.json"
    sessions = json.loads(path.read_text())["sessions"] if path.is_file() else []
    sessions.append({"outcome": outcome, "seconds": round(seconds, 1), "ended": time.time()})
    path.write_text(json.dumps({"outcome": outcome, "sessions": sessions}, indent=1))
    log_event(log, "network stopped", outcome=outcome, seconds=round(seconds, 1),
              run=str(Path(lay.root)))
