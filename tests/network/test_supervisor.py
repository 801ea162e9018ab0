"""The supervisor with real child processes: restarts, giving up, a finished critical role,
health waits, kill -9 and a clean stop; and the role configs a network writes."""

from __future__ import annotations

import json
import sys
import time
import tomllib
from pathlib import Path

import pytest

from meshrl.config import EXIT_REFUSED, load_config
from meshrl.network.config import NetworkConfig
from meshrl.network.keys import DevKeys
from meshrl.network.roles import Layout, RoleSpec, build_roles
from meshrl.network.supervisor import RoleFailed, Supervisor
from meshrl.pool import RULE_FIELDS, tasks_config
from meshrl.protocol.anvil import _free_port

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _events(root: Path) -> list[dict]:
    return [json.loads(x) for x in (root / "events.jsonl").read_text().splitlines()]


def _until(check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (out := check()):
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)
    return out


def test_dead_role_is_restarted_and_logged(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, backoff_s=0.1, max_fast_deaths=50)
    marker = tmp_path / "runs"
    code = (f"import pathlib,sys; p=pathlib.Path({str(marker)!r}); n=len(p.read_text()) "
            "if p.exists() else 0; p.write_text('x'*(n+1)); print('run', n+1); "
            "sys.exit(4 if n < 2 else 0) if n < 2 else __import__('time').sleep(60)")
    sup.start(RoleSpec("flaky", _py(code)))
    _until(lambda: sup.poll() is not None and marker.exists() and len(marker.read_text()) >= 3)
    sup.stop_all(timeout=5)
    ev = _events(tmp_path)
    assert [e["event"] for e in ev if e["event"] == "died"] == ["died", "died"]
    assert all(e["rc"] == 4 for e in ev if e["event"] == "died")
    assert [e["restarts"] for e in ev if e["event"] == "start"] == [0, 1, 2]
    assert ev[-1]["event"] == "stopped"
    assert (tmp_path / "logs" / "flaky.log").read_text().count("run ") == 3


def test_role_refused_for_good_is_retired_not_restarted(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, backoff_s=0.01, max_fast_deaths=2)
    sup.start(RoleSpec("blacklisted", _py(f"import sys; sys.exit({EXIT_REFUSED})")))
    sup.start(RoleSpec("alive", _py("import time; time.sleep(60)")))
    _until(lambda: sup.poll() is not None and sup.procs["blacklisted"].done)
    for _ in range(20):  # more rounds than max_fast_deaths: no restart, the run goes on
        assert sup.poll() == []
        time.sleep(0.02)
    sup.stop_all(timeout=5)
    ev = _events(tmp_path)
    assert [e["event"] for e in ev if e["role"] == "blacklisted"] == ["start", "retired"]
    assert next(e for e in ev if e["event"] == "retired")["rc"] == EXIT_REFUSED


def test_role_dying_at_start_ends_the_run(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, backoff_s=0.01, max_fast_deaths=3)
    sup.start(RoleSpec("broken", _py("import sys; sys.exit(2)")))
    with pytest.raises(RoleFailed, match="broken died 3 times"):
        _until(lambda: sup.poll() == ["never"], timeout=30)
    sup.stop_all(timeout=5)
    ev = [e["event"] for e in _events(tmp_path)]
    assert ev == ["start", "died", "start", "died", "start", "gave up"]


def test_critical_role_finishing_is_reported_once(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    sup.start(RoleSpec("trainer", _py("print('done')"), critical=True))
    assert _until(lambda: sup.poll()) == ["trainer"]
    assert sup.poll() == []  # not restarted, not reported again
    sup.stop_all(timeout=5)


def test_kill_nine_then_restart_and_health_wait(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, backoff_s=0.1)
    port = _free_port()  # not a fixed range: `make test` runs two workers beside a network
    server = _py(f"import http.server as h; h.HTTPServer(('127.0.0.1', {port}), "
                 "h.SimpleHTTPRequestHandler).serve_forever()")
    p = sup.start(RoleSpec("web", server, health=f"http://127.0.0.1:{port}/"), ready_timeout=30)
    first = p.popen.pid
    sup.kill("web")
    _until(lambda: (sup.poll() is not None) and p.popen.pid != first)
    sup.wait_healthy(p, 30)
    sup.stop_all(timeout=5)
    ev = [e["event"] for e in _events(tmp_path)]
    assert ev == ["start", "killed", "died", "start", "stopped"]


@pytest.mark.timing
def test_stop_is_clean_and_fast(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    for i in range(3):
        sup.start(RoleSpec(f"sleeper-{i}", _py("import time; time.sleep(600)")))
    t0 = time.monotonic()
    sup.stop_all(timeout=5)
    assert time.monotonic() - t0 < 5
    stopped = [e for e in _events(tmp_path) if e["event"] == "stopped"]
    assert [e["role"] for e in stopped] == ["sleeper-2", "sleeper-1", "sleeper-0"]
    assert all(e["rc"] == -15 for e in stopped)


def test_role_configs_share_the_pool_rules(tmp_path: Path) -> None:
    cfg = load_config(NetworkConfig, [str(CONFIGS / "network.toml")],
                      ["--dir", str(tmp_path)])
    lay = Layout(cfg)
    roles = build_roles(lay, lay.keys(), pool_id=1)
    names = [r.name for r in roles]
    assert names == ["discovery", "orchestrator", "origin", "relay-0", "relay-1", "trainer",
                     "validator", "validator-1", "worker-0", "worker-1", "worker-2",
                     "cheater-0", "dashboard"]
    read = {n: tomllib.loads(lay.config_path(n).read_text())
            for n in ("orchestrator", "validator", "validator-1", "trainer", "worker-0",
                      "cheater-0")}
    published = read["orchestrator"]["rules"]
    # the validators and every worker pin every rule to the published value
    for role in ("validator", "validator-1", "worker-0", "cheater-0"):
        assert read[role]["rules"] == published, role
    assert set(published) == set(RULE_FIELDS)
    assert published["proof_profile"] == "meshrl-cpu-engine"  # the demo's: every worker is ours
    # the trainer signs every policy version; relays, workers and the validator believe only it
    trainer = lay.keys().trainer().address
    assert published["policy_signer"] == trainer
    for relay in (r for r in roles if r.name.startswith("relay-")):
        assert relay.argv[relay.argv.index("--publisher") + 1] == trainer
    # ... for this pool's run alone (the id workers and validators take from the rules)
    for server in (r for r in roles if r.name == "origin" or r.name.startswith("relay-")):
        assert server.argv[server.argv.index("--run") + 1] == "pool-1"
    # origin and relays hold every version a file may still be judged by (async lag + verdicts)
    for server in (r for r in roles if r.name == "origin" or r.name.startswith("relay-")):
        assert int(server.argv[server.argv.index("--keep") + 1]) >= published["async_level"] + 4
    wide = Layout(cfg.model_copy(update={"pool": cfg.pool.model_copy(update={"async_level": 24})}))
    origin = next(r for r in build_roles(wide, wide.keys(), 1)
                  if r.name == "origin")
    assert origin.argv[origin.argv.index("--keep") + 1] == "28"
    servers = read["orchestrator"]["work"]["shardcast_servers"]
    assert servers == read["validator"]["shardcast_servers"]
    assert servers[-1] == lay.origin_url and len(servers) == 3
    t = read["trainer"]
    assert t["rollout"]["group_size"] == published["group_size"] == 8
    assert tasks_config(t["tasks"]).model_dump(mode="json") == published["task"]
    assert t["async_level"] == published["async_level"]
    assert read["cheater-0"]["cheat"] == {"mode": "forge-rewards", "after_step": 3}
    assert read["worker-0"]["cheat"] == {"mode": "none"}
    assert all(r.threads == 1 for r in roles)
    assert read["orchestrator"]["readers"] == [DevKeys(4).trainer().address]


def test_fault_plan_kills_and_measures_recovery(tmp_path: Path) -> None:
    from meshrl.network.faults import Faults

    port = _free_port()
    plan = tmp_path / "faults.toml"
    plan.write_text('settle_s = 0.5\n[[kill]]\nrole = "web"\nat_s = 0.3\n'
                    '[[kill]]\nrole = "sleeper"\nat_s = 0.6\n')
    sup = Supervisor(tmp_path, backoff_s=0.1)
    server = _py(f"import http.server as h; h.HTTPServer(('127.0.0.1', {port}), "
                 "h.SimpleHTTPRequestHandler).serve_forever()")
    sup.start(RoleSpec("web", server, health=f"http://127.0.0.1:{port}/"), ready_timeout=30)
    sup.start(RoleSpec("sleeper", _py("import time; time.sleep(600)")))
    faults = Faults(str(plan), ["web", "sleeper"])
    with pytest.raises(ValueError, match="no role named"):
        Faults(str(plan), ["web"])

    def done() -> bool:
        sup.poll()
        faults.tick(sup)
        return all(r.recover_s is not None for r in faults.records)

    _until(done, timeout=30)
    sup.stop_all(timeout=5)
    for r in faults.summary():
        assert r["pid"] > 0 and 0 < r["detect_s"] <= r["recover_s"] < 30, r
    ev = [(e["event"], e["role"]) for e in _events(tmp_path)]
    assert ("killed", "web") in ev and ("recovered", "web") in ev
    assert ("recovered", "sleeper") in ev


def test_cpu_seconds_per_role_count_every_process_and_reaped_children(tmp_path: Path) -> None:
    """cpu.json: a role that burns ~0.6 CPU s in a child it waits for, then dies and is
    restarted, is counted for both of its processes; a sleeping role is near zero."""
    from meshrl.network.report import _cpu

    burn = ("import subprocess,sys,time; subprocess.run([sys.executable,'-c',"
            "'import time\\nt=time.process_time()\\nwhile time.process_time()-t<0.6: pass']); "
            "time.sleep(0.3); sys.exit(4)")
    sup = Supervisor(tmp_path, backoff_s=0.05, max_fast_deaths=50)
    sup.start(RoleSpec("worker-0", _py(burn)))
    sup.start(RoleSpec("relay-0", _py("import time; time.sleep(60)")))
    _until(lambda: sup.poll() is not None and len(sup.cpu.get("worker-0", {})) >= 2
           and max(sup.cpu["worker-0"].values()) >= 0.6, timeout=60)
    sup.write_cpu(tmp_path / "cpu.json")
    sup.stop_all(timeout=5)
    raw = json.loads((tmp_path / "cpu.json").read_text())
    assert raw["roles"]["worker-0"] >= 0.6, raw  # the first process whole, and the next
    assert len(sup.cpu["worker-0"]) >= 2
    assert raw["roles"]["relay-0"] < 0.5 and raw["cores"] >= 1 and raw["wall_s"] > 0
    got = _cpu(tmp_path)
    assert got is not None and set(got["kinds"]) == {"worker", "relay", "supervisor"}
    assert got["kinds"]["worker"]["cpu_s"] == round(raw["roles"]["worker-0"], 1)
    from meshrl.network.report import _role_kind
    assert [_role_kind(n) for n in ("validator", "validator-1", "cheater-0", "trainer")] == [
        "validator", "validator", "cheater", "trainer"]
    assert 0 < got["used_share"] <= 1.0
