"""No module branches on an exception's message text: callers branch on the exception's type
(or a machine-readable code, an HTTP status), never on what its message says.

Every module under `src/meshrl` is parsed (never imported). An exception variable is a name
bound by `except ... as name` (inside that handler) or a parameter annotated with an exception
class. Its message is `str(e)`, `repr(e)`, an f-string of it, `e.args`, `e.reason`, `e.detail`,
`e.message`, `e.msg`, `e.strerror`, `e.text`, anything computed from those (`.lower()`,
subscripts, `or`, concatenation) and any local name assigned one. A branch on a message is a
comparison (`==`, `!=`, `in`, `not in`) with one as an operand, a text test on one
(`.startswith`, `re.search`, ...), a `match` on one, or an `if` / `while` / conditional
expression testing one's truthiness; and returning one, which hands the caller nothing but the
text to branch on (an error must stay an exception, or become a typed result).
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "meshrl"

MESSAGE_ATTRS = frozenset({"args", "reason", "detail", "message", "msg", "strerror", "text"})
TEXT_METHODS = frozenset({"startswith", "endswith", "find", "rfind", "index", "rindex", "count",
                          "__contains__", "__eq__", "match", "fullmatch", "search", "findall"})
TEXT_FUNCTIONS = frozenset({"match", "fullmatch", "search", "findall", "fnmatch"})
COMPARE_OPS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)

# (module, function): why reading text is the point there. Only boundaries where a third-party
# library hands over nothing but text belong here; everything past them is typed.
ALLOWED = {
    ("meshrl.protocol.backend", "revert_reason"):
        "eth-tester, web3 and JSON-RPC nodes report a revert only as text: this turns it into "
        "the reason `errors.REVERTS` maps to a class",
}


@dataclass(frozen=True)
class Finding:
    module: str
    function: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} ({self.function}): {self.code}"


def exception_classes(root: Path) -> frozenset[str]:
    """Names of the builtin exceptions and of every exception class defined under `root`."""
    known = {n for n, v in vars(builtins).items()
             if isinstance(v, type) and issubclass(v, BaseException)}
    bases: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                    if isinstance(b, (ast.Name, ast.Attribute)))
    grown = True
    while grown:
        new = {c for c, bs in bases.items() if c not in known and bs & known}
        known |= new
        grown = bool(new)
    return frozenset(known)


class _Finder(ast.NodeVisitor):
    def __init__(self, module: str, exceptions: frozenset[str]) -> None:
        self.module, self.exceptions = module, exceptions
        self.found: list[Finding] = []
        self.function = "<module>"
        self.bound: set[str] = set()  # exception variables in scope here
        self.tainted: set[str] = set()  # local names holding a message

    # ---- what is a message
    def _exc(self, e: ast.expr) -> bool:
        return isinstance(e, ast.Name) and e.id in self.bound

    def message(self, e: ast.expr | None) -> bool:
        if e is None:
            return False
        if isinstance(e, ast.Name):
            return e.id in self.tainted
        if isinstance(e, ast.Attribute):
            return (self._exc(e.value) and e.attr in MESSAGE_ATTRS) or self.message(e.value)
        if isinstance(e, ast.Call):
            if isinstance(e.func, ast.Name) and e.func.id in ("str", "repr", "format"):
                return any(self._exc(a) or self.message(a) for a in e.args[:1])
            return isinstance(e.func, ast.Attribute) and self.message(e.func.value)
        if isinstance(e, ast.Subscript):
            return self.message(e.value)
        if isinstance(e, ast.JoinedStr):
            return any(isinstance(v, ast.FormattedValue) and (self._exc(v.value)
                                                               or self.message(v.value))
                       for v in e.values)
        if isinstance(e, ast.BoolOp):
            return any(self.message(v) for v in e.values)
        if isinstance(e, ast.BinOp):
            return self.message(e.left) or self.message(e.right)
        if isinstance(e, ast.IfExp):
            return self.message(e.body) or self.message(e.orelse)
        if isinstance(e, ast.UnaryOp):
            return self.message(e.operand)
        return False

    def _flag(self, node: ast.AST) -> None:
        if (self.module, self.function) in ALLOWED:
            return
        self.found.append(Finding(self.module, self.function, node.lineno,  # type: ignore[attr-defined]
                                  ast.unparse(node)[:120]))

    # ---- scopes
    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        saved = self.function, self.bound, self.tainted
        if not isinstance(node, ast.Lambda):
            self.function = node.name
        a = node.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]
        self.bound = {p.arg for p in params if p.annotation is not None
                      and self._names_exception(p.annotation)}
        self.tainted = set()
        self.generic_visit(node)
        self.function, self.bound, self.tainted = saved

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _names_exception(self, annotation: ast.expr) -> bool:
        for n in ast.walk(annotation):
            name = (n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute)
                    else n.value.split("|")[0].strip()
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) else None)
            if name in self.exceptions:
                return True
        return False

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        saved = self.bound
        if node.name:
            self.bound = saved | {node.name}
        for stmt in node.body:
            self.visit(stmt)
        self.bound = saved

    # ---- where a message flows
    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        for target in node.targets:
            self._assign(target, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        if node.value is not None:
            self._assign(node.target, node.value)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.generic_visit(node)
        self._assign(node.target, node.value)

    def _assign(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            if self.message(value):
                self.tainted.add(target.id)
            else:
                self.tainted.discard(target.id)

    # ---- the branches
    def visit_Compare(self, node: ast.Compare) -> None:
        if any(isinstance(op, COMPARE_OPS) for op in node.ops) and any(
                self.message(x) for x in (node.left, *node.comparators)):
            self._flag(node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        on_text = isinstance(f, ast.Attribute) and name in TEXT_METHODS and self.message(f.value)
        over_text = name in TEXT_FUNCTIONS and any(self.message(a) for a in node.args)
        if on_text or over_text:
            self._flag(node)
        self.generic_visit(node)

    def _test(self, node: ast.If | ast.While | ast.IfExp | ast.Assert) -> None:
        if self.message(node.test):
            self._flag(node.test)
        self.generic_visit(node)

    visit_If = visit_While = visit_IfExp = visit_Assert = _test

    def visit_Return(self, node: ast.Return) -> None:
        # an error handed back as its text leaves the caller nothing but the text to branch on
        if self.message(node.value):
            self._flag(node)
        self.generic_visit(node)

    def visit_Match(self, node: ast.Match) -> None:
        if self.message(node.subject):
            self._flag(node.subject)
        self.generic_visit(node)


def text_branches(source: str, module: str = "snippet",
                  exceptions: frozenset[str] | None = None) -> list[Finding]:
    finder = _Finder(module, exception_classes(SRC) if exceptions is None else exceptions)
    finder.visit(ast.parse(source))
    return finder.found


def tree_text_branches(root: Path) -> list[Finding]:
    exceptions = exception_classes(root)
    out: list[Finding] = []
    for path in sorted(root.rglob("*.py")):
        parts = ["meshrl", *path.relative_to(root).with_suffix("").parts]
        out += text_branches(path.read_text(), ".".join(p for p in parts if p != "__init__"),
                             exceptions)
    return out


# ------------------------------------------------------------------------------------- the tests
def test_no_module_branches_on_message_text() -> None:
    assert [str(f) for f in tree_text_branches(SRC)] == []


def test_the_allowed_boundary_still_exists() -> None:
    """An entry of `ALLOWED` names a function that exists and reads text (else it is stale)."""
    for (module, function) in ALLOWED:
        path = SRC.joinpath(*module.split(".")[1:]).with_suffix(".py")
        tree = ast.parse(path.read_text())
        fn = next(n for n in ast.walk(tree)
                  if isinstance(n, ast.FunctionDef) and n.name == function)
        assert text_branches(ast.unparse(fn), "elsewhere"), (module, function)


# the branches on text this repository had before its errors were typed, each must be caught
OLD_BRANCHES = {
    "validator._post": '''
async def _post(self, v):
    try:
        await self.orch.call("POST", "/verdicts", Verdict(**v))
    except WireHTTPError as e:
        waiting = e.status == 409 and any(s in e.detail for s in ("uploaded", "granted"))
        return e.status == 409 and not waiting
''',
    "worker._deliver": '''
async def _deliver(self, courier):
    try:
        await deliver_all()
    except (WireHTTPError, OSError, TxReverted) as e:
        if isinstance(e, TxReverted) and "not in pool" not in str(e):
            raise
''',
    "courier.submit": '''
async def submit(self, entry):
    try:
        r = await submit_work()
    except TxReverted as e:
        if "duplicate file" in str(e):
            raise DuplicateSubmission(str(e)) from None
        raise
''',
    "courier.upload": '''
async def upload(self, entry, path):
    try:
        await self.orch.upload("PUT", entry.slot_url, path, entry.sha256)
    except WireHTTPError as e:
        if e.status == 409 and e.reason == "slot already used":
            return
''',
    "courier.grant": '''
async def grant(self):
    try:
        slot = await self.orch.call("POST", "/uploads")
    except WireHTTPError as e:
        if e.status == 409 and e.reason == "stale work":
            raise StaleFile(e.detail) from None
''',
    "chainview.eject": '''
async def eject(self, node: str) -> str:
    try:
        await self.run(self.protocol.eject_node, self.pool_id, node)
        return ""
    except (TxReverted, ChainError) as e:
        return str(e)
''',
    "network_up outcome": '''
def network_up(cfg):
    outcome = "interrupted"
    try:
        run()
    except RoleFailed as e:
        outcome = f"failed: {e}"
    return 0 if outcome in ("trained", "interrupted", "time limit") else 1
''',
    "eject string, branched on later": '''
async def eject(self, node):
    try:
        await self.run(node)
        why = ""
    except ChainError as e:
        why = str(e)
    if why:
        log(why)
''',
}


def test_every_old_text_branch_is_caught() -> None:
    for name, source in OLD_BRANCHES.items():
        assert text_branches(source), name


def test_other_text_forms_are_caught() -> None:
    for source in [
        "try:\n    f()\nexcept ValueError as e:\n    if str(e).startswith('bad'):\n        g()\n",
        "try:\n    f()\nexcept OSError as e:\n    if 'x' in e.args:\n        g()\n",
        "try:\n    f()\nexcept OSError as e:\n    ok = re.search('refused', f'{e}')\n",
        "try:\n    f()\nexcept OSError as e:\n    match e.args[0]:\n        case 'x':\n"
        "            g()\n",
        "try:\n    f()\nexcept OSError as e:\n    text = str(e).lower()\nif text == 'x':\n"
        "    g()\n",
        "def f(exc: BaseException) -> None:\n    if 'gas' in (exc.args[0] or ''):\n        g()\n",
        "try:\n    f()\nexcept KeyError as e:\n    g() if e.args else h()\n",
    ]:
        assert text_branches(source), source


def test_branches_on_types_codes_and_statuses_pass() -> None:
    source = '''
async def post(self, v):
    try:
        await self.orch.call("POST", "/verdicts", v)
    except NotAwaitingVerdict:
        return True
    except WireHTTPError as e:
        if e.status == 409 or e.code == ErrorCode.NOT_SUBMITTED_YET:
            return False
        log_event(log, "verdict refused", error=str(e), detail=e.detail)
        raise Refused(f"verdict refused: {e}") from None
    except TxReverted as e:
        if isinstance(e, NodeNotInPool):
            return False
        raise
    for e in events:  # not an exception: an event's arguments are data
        if e.args["pool"] == self.pool:
            g()
'''
    assert text_branches(source) == []
