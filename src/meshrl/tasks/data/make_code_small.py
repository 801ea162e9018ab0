"""Generate code_small.jsonl: small stdin/stdout programming problems with hidden tests.

Run `python src/meshrl/tasks/data/make_code_small.py` to rewrite the file; it is seeded, so the
output is the same every time. Each problem family has a reference solution (`ref`) the tests'
outputs are computed with; the tests are random inputs, none of them shown in the prompt.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

Gen = Callable[[random.Random], str]


def _ints(rng: random.Random, lo: int = -50, hi: int = 50) -> str:
    xs = [rng.randint(lo, hi) for _ in range(rng.randint(1, 8))]
    return f"{len(xs)}\n{' '.join(map(str, xs))}\n"


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdeilmnorstu") for _ in range(rng.randint(1, 12))) + "\n"


def _nums(s: str) -> list[int]:
    return [int(x) for x in s.split()[1:]]


FAMILIES: list[tuple[str, Gen, Callable[[str], str]]] = [
    ("Read an integer n and then n integers. Print their sum.", _ints,
     lambda s: str(sum(_nums(s)))),
    ("Read an integer n and then n integers. Print the largest.", _ints,
     lambda s: str(max(_nums(s)))),
    ("Read an integer n and then n integers. Print them sorted ascending, space-separated.",
     _ints, lambda s: " ".join(map(str, sorted(_nums(s))))),
    ("Read an integer n and then n integers. Print how many are even.", _ints,
     lambda s: str(sum(x % 2 == 0 for x in _nums(s)))),
    ("Read a word and print it reversed.", _word, lambda s: s.strip()[::-1]),
    ("Read a word and print the number of vowels (a, e, i, o, u) in it.", _word,
     lambda s: str(sum(c in "aeiou" for c in s.strip()))),
    ("Read a word and print YES if it is a palindrome, NO otherwise.",
     lambda r: r.choice(["abba\n", "level\n", "noon\n"]) if r.random() < 0.4 else _word(r),
     lambda s: "YES" if s.strip() == s.strip()[::-1] else "NO"),
    ("Read an integer n (0 <= n <= 40) and print the n-th Fibonacci number (F0=0, F1=1).",
     lambda r: f"{r.randint(0, 40)}\n",
     lambda s: str(_fib(int(s)))),
    ("Read an integer n (1 <= n <= 10^6) and print the sum of its decimal digits.",
     lambda r: f"{r.randint(1, 10**6)}\n", lambda s: str(sum(map(int, s.strip())))),
    ("Read two integers a and b (1 <= a, b <= 10^6) and print their greatest common divisor.",
     lambda r: f"{r.randint(1, 10**6)} {r.randint(1, 10**6)}\n",
     lambda s: str(_gcd(*map(int, s.split())))),
    ("Read an integer n (2 <= n <= 10^5) and print YES if it is prime, NO otherwise.",
     lambda r: f"{r.choice([r.randint(2, 10**5), r.choice([2, 3, 97, 7919, 99991])])}\n",
     lambda s: "YES" if _prime(int(s)) else "NO"),
    ("Read an integer n (1 <= n <= 20) and print n factorial.",
     lambda r: f"{r.randint(1, 20)}\n", lambda s: str(_fact(int(s)))),
]


def _fib(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


def _fact(n: int) -> int:
    out = 1
    for k in range(2, n + 1):
        out *= k
    return out


def generate(per_family: int = 3, tests: int = 5, seed: int = 0) -> list[dict]:
    """`per_family` rows per family, each with `tests` hidden tests (distinct inputs)."""
    rng = random.Random(seed)
    rows = []
    for prompt, gen, ref in FAMILIES:
        for _ in range(per_family):
            inputs: list[str] = []
            while len(inputs) < tests:
                x = gen(rng)
                if x not in inputs:
                    inputs.append(x)
                if len(inputs) == tests and len({ref(x) for x in inputs}) < 2:
                    inputs.pop()  # one printed constant must never pass every test
            rows.append({"prompt": prompt,
                         "tests": [{"input": x, "output": ref(x) + "\n"} for x in inputs]})
    return rows


if __name__ == "__main__":
    out = Path(__file__).with_name("code_small.jsonl")
    out.write_text("".join(json.dumps(r) + "\n" for r in generate()))
    print(f"wrote {out}")
