"""The page in a real headless Chromium, served by a real `meshrl dashboard` process that reads
a recorded run (recorded.py: its files, and its orchestrator's answers over loopback HTTP): at
the warm start, then as the run moves into RL, with a screenshot of each under the test's tmp
directory. The curves must carry axes, tick values, axis titles and the 80% line."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from . import recorded as rec

BROWSER, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(ok: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        got = ok()
        if got:
            return got
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _rows_become(rows: Callable[[], list[list[str]]], want: list[list[str]]) -> None:
    """Wait up to 30 s for a table's rows to read `want`, then assert them. The dashboard reads
    the orchestrator's `/nodes` and `/ledger` in two requests, so one refresh can straddle the
    recorded run's change: under load a refresh showed a validator's counts with its lag
    still 0, and a node's new file counts beside its old "none yet" policy."""
    with contextlib.suppress(AssertionError):  # timed out: the assert shows what is there
        _wait(lambda: rows() == want, 30, "rows not updated")
    assert rows() == want, rows()


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


# every text of an SVG chart, by class: the page's own drawing, read in one script (the page
# redraws on every refresh)
CHART = """
const svg = document.getElementById(arguments[0]);
const texts = c => [...svg.querySelectorAll("text." + c)].map(t => t.textContent);
return {xlabel: texts("xlabel"), ylabel: texts("ylabel"), xtick: texts("xtick"),
        ytick: texts("ytick"), target: texts("target-label"), last: texts("last"),
        empty: texts("empty"), lines: svg.querySelectorAll("polyline.series").length,
        targets: svg.querySelectorAll("line.target").length,
        axes: svg.querySelectorAll("line.x-axis, line.y-axis").length};
"""
ROWS = """
return [...document.querySelectorAll("#" + arguments[0] + " tbody tr")]
  .map(r => [...r.cells].map(c => c.textContent));
"""


def test_page_at_warm_start_and_in_rl(tmp_path: Path) -> None:
    if not (Path(BROWSER).exists() and Path(DRIVER).exists()):
        pytest.skip("chromium / chromedriver not installed (apt-get install chromium "
                    "chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    run = tmp_path / "run"
    orch = rec.Orchestrator()
    rec.write_warm(run, orch.url, time.time())
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "dashboard.log").open("wb")
    dash = subprocess.Popen([sys.executable, "-m", "meshrl.cli", "dashboard", "--run", str(run),
                             "--port", str(port), "--refresh_s", "0.3"],
                            stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    opts = webdriver.ChromeOptions()
    opts.binary_location = BROWSER
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = None
    try:
        _wait(lambda: _up(url) or dash.poll() is not None, 60, "dashboard not up")
        assert dash.poll() is None, (tmp_path / "dashboard.log").read_text()
        driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
        driver.set_window_size(1200, 1800)
        driver.get(url + "/")
        phase = lambda: driver.find_element("id", "phase")  # noqa: E731
        _wait(lambda: phase().get_attribute("data-phase") == "warm start", 30,
              "warm start not shown")
        text = phase().text
        assert "step 40 of 400" in text and "held-out accuracy 22%" in text, text
        assert "RL starts at 30%" in text, text
        acc = driver.execute_script(CHART, "accuracy")
        assert acc["xlabel"] == ["trainer time (s)"] and acc["ylabel"] == ["held-out accuracy"]
        assert acc["ytick"] == ["0%", "20%", "40%", "60%", "80%", "100%"], acc
        assert acc["xtick"] == ["0", "50", "100"], acc
        assert (acc["targets"], acc["target"], acc["axes"]) == (1, ["80% target"], 2), acc
        assert acc["lines"] == 1 and acc["last"] == ["22%"], acc  # the warm start's curve
        reward = driver.execute_script(CHART, "reward")
        assert reward["lines"] == 0 and reward["axes"] == 2, reward
        assert reward["empty"] == ["RL not started: the trainer is in its warm start"]
        assert reward["xtick"] == ["0", "1"] and reward["ytick"][-1] == "1", reward
        nodes = _wait(lambda: len(r := driver.execute_script(ROWS, "nodes")) == 4 and r, 30,
                      "nodes not shown")
        assert [r[0] for r in nodes] == ["worker-0", "worker-1", "cheater-0 (cheat)",
                                         "0x5742…00d1"]
        assert {r[2] for r in nodes} == {"none yet"}  # policy -1: none loaded yet
        waiting = driver.find_element("id", "waiting").text
        assert "warm start" in waiting and "members are generating" not in waiting, waiting
        vals = driver.execute_script(ROWS, "validators")
        assert [r[0] for r in vals] == ["validator", "validator-1 (rogue)"], vals
        assert driver.save_screenshot(str(tmp_path / "warm_start.png"))

        # the run moves on: the warm start ends, RL reaches step 12 at 84% held-out
        orch.nodes, orch.ledger = rec.rl_orchestrator()
        rec.write_rl(run, time.time())
        _wait(lambda: phase().get_attribute("data-phase") == "rl", 30, "RL not shown")
        text = phase().text
        assert text.startswith("RL · step 12"), text
        assert "held-out accuracy 84% at step 12" in text, text
        assert "warm start: 50 steps to 31%" in text, text
        acc = driver.execute_script(CHART, "accuracy")
        assert acc["lines"] == 2 and acc["last"] == ["31%", "84%"], acc
        assert acc["target"] == ["80% target"] and acc["ytick"][-1] == "100%", acc
        assert acc["xlabel"] == ["trainer time (s)"] and acc["xtick"][-1] == "250", acc
        reward = driver.execute_script(CHART, "reward")
        assert reward["xlabel"] == ["RL step"] and reward["ylabel"] == ["mean reward"]
        assert reward["lines"] == 1 and reward["empty"] == [], reward
        assert reward["xtick"] == ["0", "2", "4", "6", "8", "10", "12"], reward
        assert reward["last"] == ["0.78"] and reward["ytick"][0] == "0", reward
        # judged, accepted, accused, upheld, overturned, lag
        validators = lambda: [r[1:7] for r in driver.execute_script(ROWS, "validators")]  # noqa: E731
        _rows_become(validators, [["4", "3", "1", "1", "0", "2"], ["2", "0", "1", "0", "1", "1"]])
        stranger = lambda: [r[1:7] for r in driver.execute_script(ROWS, "nodes")  # noqa: E731
                            if r[0] == "0x5742…00d1"]
        _rows_become(stranger, [["healthy", "11", "55.5", "3", "0", "2"]])
        assert "members are generating" in driver.find_element("id", "waiting").text
        invalid = driver.find_element("id", "invalid").text
        assert "validator-1: 0x5742…00d1 hard_invalid: rogue" in invalid, invalid
        assert driver.save_screenshot(str(tmp_path / "rl.png"))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        if driver is not None:
            driver.quit()
        dash.terminate()
        dash.wait(10)
        log.close()
        orch.close()
