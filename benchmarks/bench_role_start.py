"""What a `meshrl` role process costs to start: executed (a fresh interpreter that imports torch,
web3, pyarrow and the role's modules) against forked from the role launcher's preloaded server
(`meshrl/network/launcher.py`, what `network up` and the tests' role helpers use).

The command is a short real one that imports what a role imports: `meshrl inference generate`
of 4 tokens on a tiny saved model (torch, transformers, the engine), one torch thread. Each way
starts it `--starts` times, one after another, and waits for it. CPU is this machine's busy
time over the starts (`/proc/stat`: the forked child is the server's, not ours, so no rusage of
ours sees it); run it on an otherwise idle machine. The fork server's own start (its preload,
once per supervisor) is its own line, `cold`, and is also spread over the starts
(`amortized_cpu_s`).

One JSON object per line: `mode: exec` and `mode: fork` (CPU and wall seconds per start), then
`mode: compare` with `speedup` = exec / fork CPU per start (warm server) and the amortized one.

    PYTHONPATH=src python benchmarks/bench_role_start.py [--starts 6]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from meshrl.network.launcher import RoleLauncher  # noqa: E402


def _busy_s() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _model(tmp: Path) -> Path:
    from meshrl.model import CharTokenizer, build_model, save_model

    tok = CharTokenizer()
    return save_model(build_model("qwen2-tiny", tok.vocab_size, seed=0), tok, tmp / "model")


def _run(launcher: RoleLauncher, argv: list[str], log: Path, env: dict[str, str],
         starts: int) -> tuple[float, float]:
    """(busy CPU s, wall s) per start, each start waited for."""
    cpu0, t0 = _busy_s(), time.perf_counter()
    for _ in range(starts):
        code = launcher.start(argv, log, env).wait(300)
        if code != 0:
            raise SystemExit(f"{argv[3:6]} exited {code}: {log.read_text()[-2000:]}")
    return (_busy_s() - cpu0) / starts, (time.perf_counter() - t0) / starts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        model = _model(tmp)
        argv = [sys.executable, "-m", "meshrl.cli", "inference", "generate", "--model",
                str(model), "--prompts", '["1+1="]', "--sampling.max_new_tokens", "4",
                "--engine.num_threads", "1"]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
        exec_cpu, exec_wall = _run(RoleLauncher(fork=False), argv, tmp / "exec.log", env,
                                   args.starts)
        print(json.dumps({"mode": "exec", "starts": args.starts, "cpu_s": round(exec_cpu, 2),
                          "wall_s": round(exec_wall, 2)}), flush=True)
        fork = RoleLauncher()
        cold_cpu, cold_wall = _run(fork, argv, tmp / "fork.log", env, 1)  # the server's start
        print(json.dumps({"mode": "cold", "cpu_s": round(cold_cpu, 2),
                          "wall_s": round(cold_wall, 2)}), flush=True)
        fork_cpu, fork_wall = _run(fork, argv, tmp / "fork.log", env, args.starts)
        print(json.dumps({"mode": "fork", "starts": args.starts, "cpu_s": round(fork_cpu, 2),
                          "wall_s": round(fork_wall, 2)}), flush=True)
        amortized = (cold_cpu + fork_cpu * args.starts) / (args.starts + 1)
        print(json.dumps({"mode": "compare", "cores": os.cpu_count(),
                          "speedup": round(exec_cpu / fork_cpu, 2),
                          "amortized_cpu_s": round(amortized, 2),
                          "amortized_speedup": round(exec_cpu / amortized, 2),
                          "wall_speedup": round(exec_wall / fork_wall, 2)}), flush=True)


if __name__ == "__main__":
    main()
