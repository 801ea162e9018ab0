"""No shardcast test sleeps a fixed time in place of an event.

`await asyncio.sleep(0.3)  # the relays are gone by then` passes on an idle machine and fails
on a loaded one (or hides a broken behaviour behind a generous time). A test waits for what it
needs instead: a state the parts expose (a server's /health `held_polls`, `streams_open`,
`clients_admitted`; a client's attributes), polled with a deadline (`conftest.until`,
`conftest.wait_until`).

Every module under tests/shardcast is parsed (never imported). A fixed sleep is a call of
`sleep` (`time.sleep`, `asyncio.sleep`, any `*.sleep`) whose first argument is a literal number,
outside a `for` / `while` loop of its own function: a loop that sleeps between looks at a
condition is a poll, not a fixed sleep. Where the time itself is under test (a rate limiter's
window), the call carries `fixed-sleep-ok: <why>` in a comment on its line or the line above.
"""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARKER = "fixed-sleep-ok:"
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)


def _is_fixed_sleep(node: ast.Call) -> bool:
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if name != "sleep" or not node.args:
        return False
    try:
        value = ast.literal_eval(node.args[0])
    except ValueError:
        return False  # a name or an expression: a computed time (a backoff, a poll interval)
    return isinstance(value, int | float)


def _justified(lines: list[str], line: int) -> bool:
    """The marker and a reason in a comment on the call's line (1-based `line`) or in a
    comment line right above it."""
    above = lines[line - 2] if line >= 2 and lines[line - 2].lstrip().startswith("#") else ""
    for text in (lines[line - 1], above):
        before, found, why = text.partition(MARKER)
        if found and "#" in before and why.strip():
            return True
    return False


def fixed_sleeps(source: str, name: str = "<source>") -> list[str]:
    """`name:line: code` of each unjustified fixed sleep in `source`."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _is_fixed_sleep(node)):
            continue
        up = parents.get(node)
        while up is not None and not isinstance(up, _SCOPES + _LOOPS):
            up = parents.get(up)
        if isinstance(up, _LOOPS) or _justified(lines, node.lineno):
            continue
        found.append((node.lineno, f"{name}:{node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


def test_no_fixed_sleep_in_the_shardcast_tests() -> None:
    found = [f for path in sorted(HERE.glob("*.py"))
             for f in fixed_sleeps(path.read_text(), path.name)]
    assert not found, ("a fixed sleep stands in for an event: wait for a state instead "
                       f"(conftest.until / wait_until), or justify it with `{MARKER} why`:\n"
                       + "\n".join(found))


def test_the_check_finds_fixed_sleeps_and_spares_polls_and_justified_ones() -> None:
    source = '''
import asyncio, time
from time import sleep

async def waits_an_event():
    await asyncio.sleep(0.3)  # the relays are gone by then

def threaded():
    time.sleep(1)
    sleep(0.5)

async def polls(ready, interval):
    while not ready():
        await asyncio.sleep(0.02)
    for _ in range(3):
        if ready():
            time.sleep(0.1)
    await asyncio.sleep(interval)  # a computed time: not a literal

async def measures():
    # fixed-sleep-ok: the window expiring is under test
    await asyncio.sleep(0.05)
    await asyncio.sleep(0.05)  # fixed-sleep-ok: so is this one
    await asyncio.sleep(0.05)  # fixed-sleep-ok:

def loop_outside_a_helper():
    while True:
        async def helper():
            await asyncio.sleep(0.2)  # its own function: the loop around it does not count
        break
'''
    found = [f.split(":", 2)[1] for f in fixed_sleeps(source)]
    assert found == ["6", "9", "10", "24", "29"]
