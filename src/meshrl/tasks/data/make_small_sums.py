"""Generate small_sums.jsonl: every sum a + b of two integers from 1 to 50, once each.

Run `python src/meshrl/tasks/data/make_small_sums.py` to rewrite the file; the order is a seeded
shuffle, so the output is the same every time. Each pair appears once, so no held-out question
is also a training question. It is the task a real pretrained model of 135M parameters
(SmolLM2-135M-Instruct, chat prompts with " Answer with just the number.") starts at 10-20%
held-out on: it knows the format of an answer and gets most sums wrong (configs/smollm2.toml).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).with_name("small_sums.jsonl")
LOW, HIGH = 1, 50
SEED = 20261206


def rows() -> list[dict[str, str]]:
    pairs = [(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)]
    random.Random(SEED).shuffle(pairs)
    return [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in pairs]


def main() -> None:
    OUT.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    print(f"{OUT}: {len(rows())} rows")


if __name__ == "__main__":
    main()
