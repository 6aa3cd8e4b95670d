"""Candidates: kernel source plus a declarative launch spec. Pure Python, no torch import.

The candidate never writes host code. Its launch spec says which kernels to launch, in what
order, with which arguments, grid, block and dynamic shared memory, each as an expression over
the op's size variables (see ``forge_pack.targets.abi``). forge-pack writes the host glue twice from the
same spec: a ctypes/driver-API launcher during search, and a C++ launcher in the emitted package.
The format is documented in docs/candidate-format.md.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
from dataclasses import dataclass, field
from typing import Any, Mapping

from forge_pack.core.errors import ForgeError

BACKENDS = ("cuda", "cpu")
TYPE_PREFIXES = ("i32", "i64", "f32")
MAX_KERNELS = 8


@dataclass(frozen=True)
class KernelLaunch:
    name: str
    args: tuple[str, ...]
    grid: tuple[str, str, str] = ("1", "1", "1")
    block: tuple[str, str, str] = ("1", "1", "1")
    shared_mem: str = "0"

    def to_json(self) -> dict:
        return {"name": self.name, "args": list(self.args), "grid": list(self.grid),
                "block": list(self.block), "shared_mem": self.shared_mem}


@dataclass(frozen=True)
class Workspace:
    """Scratch device memory the tool allocates for multi-kernel candidates (e.g. split-row softmax)."""

    name: str
    bytes: str
    zero: bool = False  # zero-filled before the first kernel; otherwise filled with garbage in verification

    def to_json(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "zero": self.zero}


@dataclass(frozen=True)
class LaunchSpec:
    kernels: tuple[KernelLaunch, ...]
    workspaces: tuple[Workspace, ...] = ()
    requires: tuple[str, ...] = ()  # boolean expressions the signature must satisfy

    def to_json(self) -> dict:
        return {"kernels": [k.to_json() for k in self.kernels],
                "workspaces": [w.to_json() for w in self.workspaces],
                "requires": list(self.requires)}


@dataclass(frozen=True)
class Candidate:
    op: str
    backend: str
    source: str
    spec: LaunchSpec
    family: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    origin: str = "template"  # template | llm | repair | reference | user

    @property
    def content_hash(self) -> str:
        body = json.dumps({"backend": self.backend, "source": self.source, "spec": self.spec.to_json()},
                          sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()

    @property
    def label(self) -> str:
        if not self.params:
            return self.family or self.origin
        inner = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.family}({inner})"

    def to_json(self) -> dict:
        return {"op": self.op, "backend": self.backend, "source": self.source, "spec": self.spec.to_json(),
                "family": self.family, "params": dict(self.params), "origin": self.origin,
                "hash": self.content_hash}

    @staticmethod
    def from_json(d: dict) -> "Candidate":
        return Candidate(op=d["op"], backend=d["backend"], source=d["source"], spec=parse_spec(d["spec"]),
                         family=d.get("family", ""), params=dict(d.get("params", {})),
                         origin=d.get("origin", "template"))


# ---------------------------------------------------------------- parsing and validation


def parse_spec(raw: Any) -> LaunchSpec:
    """Turn a JSON object (or JSON text) into a LaunchSpec; ForgeError on anything malformed."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ForgeError(f"launch spec is not valid JSON: {e}", "see docs/candidate-format.md")
        except RecursionError:  # e.g. 100000 nested brackets from an LLM
            raise ForgeError("launch spec is nested too deeply to read", "see docs/candidate-format.md")
    if not isinstance(raw, dict):
        raise ForgeError("launch spec must be a JSON object", "see docs/candidate-format.md")
    unknown = set(raw) - {"kernels", "workspaces", "requires"}
    if unknown:
        raise ForgeError(f"launch spec has unknown keys: {sorted(unknown)}",
                         "allowed keys: kernels, workspaces, requires")
    kernels_raw = raw.get("kernels")
    if not isinstance(kernels_raw, list) or not kernels_raw or len(kernels_raw) > MAX_KERNELS:
        raise ForgeError(f"launch spec needs 'kernels': a list of 1..{MAX_KERNELS} launches",
                         "see docs/candidate-format.md")
    kernels = tuple(_parse_kernel(k, i) for i, k in enumerate(kernels_raw))
    for key in ("workspaces", "requires"):  # iterated below: a number or a string here is a malformed spec
        if not isinstance(raw.get(key) or [], list):
            raise ForgeError(f"launch spec '{key}' must be a list, got {raw[key]!r}"[:300],
                             'e.g. "requires": ["cols % 4 == 0"], "workspaces": [{"name": "ws0", "bytes": "rows * 8"}]')
    workspaces = []
    for i, w in enumerate(raw.get("workspaces", []) or []):
        if not isinstance(w, dict) or not _is_ident(w.get("name")) or "bytes" not in w:
            raise ForgeError(f"workspace #{i} needs a 'name' (identifier) and a 'bytes' expression",
                             'e.g. {"name": "ws0", "bytes": "rows * 8"}')
        workspaces.append(Workspace(w["name"], _expr_text(w["bytes"], f"workspace {w['name']}.bytes"),
                                    bool(w.get("zero", False))))
    requires = tuple(_expr_text(r, "requires") for r in raw.get("requires", []) or [])
    spec = LaunchSpec(kernels, tuple(workspaces), requires)
    for text in _all_expressions(spec):
        _check_expression(text)
    return spec


def _parse_kernel(k: Any, i: int) -> KernelLaunch:
    if not isinstance(k, dict):
        raise ForgeError(f"kernels[{i}] must be an object", "see docs/candidate-format.md")
    unknown = set(k) - {"name", "args", "grid", "block", "shared_mem"}
    if unknown:
        raise ForgeError(f"kernels[{i}] has unknown keys: {sorted(unknown)}",
                         "allowed keys: name, args, grid, block, shared_mem")
    if not _is_ident(k.get("name")):
        raise ForgeError(f"kernels[{i}].name must be the C identifier of an extern \"C\" function",
                         'e.g. "name": "softmax_rows"')
    args = k.get("args")
    if not isinstance(args, list) or not all(isinstance(a, str) and a.strip() for a in args):
        raise ForgeError(f"kernels[{i}].args must be a list of strings", 'e.g. ["x", "out", "rows", "cols"]')
    return KernelLaunch(
        name=k["name"],
        args=tuple(a.strip() for a in args),
        grid=_dim3(k.get("grid", [1, 1, 1]), f"kernels[{i}].grid"),
        block=_dim3(k.get("block", [1, 1, 1]), f"kernels[{i}].block"),
        shared_mem=_expr_text(k.get("shared_mem", 0), f"kernels[{i}].shared_mem"),
    )


def _dim3(v: Any, where: str) -> tuple[str, str, str]:
    if not isinstance(v, (list, tuple)):
        v = [v]
    if not 1 <= len(v) <= 3:
        raise ForgeError(f"{where} must have 1 to 3 entries", 'e.g. ["ceil_div(rows, 4)", 1, 1]')
    items = [_expr_text(e, where) for e in v]
    return tuple(items + ["1"] * (3 - len(items)))  # type: ignore[return-value]


def _expr_text(v: Any, where: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ForgeError(f"{where}: expected a number or an expression string, got {v!r}",
                         'expressions use size variables, + - * // % min max ceil_div, e.g. "ceil_div(rows, 4)"')
    return str(v).strip()


def _is_ident(v: Any) -> bool:
    return isinstance(v, str) and v.isidentifier()


def _all_expressions(spec: LaunchSpec):
    for k in spec.kernels:
        yield from k.grid
        yield from k.block
        yield k.shared_mem
        for a in k.args:
            yield split_typed_arg(a)[1]
    for w in spec.workspaces:
        yield w.bytes
    yield from spec.requires


def split_typed_arg(arg: str) -> tuple[str | None, str]:
    """'i32:cols' -> ('i32', 'cols'); 'x' -> (None, 'x')."""
    head, sep, tail = arg.partition(":")
    if sep and head.strip() in TYPE_PREFIXES:
        return head.strip(), tail.strip()
    return None, arg


# ---------------------------------------------------------------- safe expressions

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Div: operator.truediv,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
           ast.BitOr: operator.or_}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge}
_FUNCS = {"min": min, "max": max, "ceil_div": lambda a, b: -(-a // b),
          "round_up": lambda a, b: -(-a // b) * b, "int": int, "float": float}


def _check_expression(text: str) -> None:
    try:
        tree = ast.parse(text, mode="eval")
        nodes = list(ast.walk(tree))
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # deep nesting: the parser gives up
        raise ForgeError(f"cannot parse expression {text[:200]!r}",
                         "expressions use size variables, numbers, + - * / // % << >> min max ceil_div round_up")
    for node in nodes:
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS or node.keywords:
                raise ForgeError(f"expression {text!r} calls something other than {sorted(_FUNCS)}",
                                 "only these functions are allowed in launch expressions")
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd, ast.Not,
                                   ast.BoolOp, ast.And, ast.Or, ast.Compare, ast.Name, ast.Constant,
                                   ast.Load, ast.IfExp, *_BINOPS, *_CMPOPS)):
            raise ForgeError(f"expression {text!r} uses {type(node).__name__}, which is not allowed",
                             "launch expressions are arithmetic over size variables")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            raise ForgeError(f"expression {text!r} has a non-numeric constant", "use numbers only")


def evaluate(text: str, env: Mapping[str, int | float]) -> int | float | bool:
    """Evaluate a launch expression over size variables. Raises ForgeError on unknown names."""
    _check_expression(text)
    return _eval(ast.parse(text, mode="eval").body, env, text)


def _eval(node: ast.AST, env: Mapping[str, int | float], text: str):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ForgeError(f"expression {text!r} uses unknown name {node.id!r}",
                             f"known names for this op: {', '.join(sorted(env))}")
        return env[node.id]
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env, text), _eval(node.right, env, text)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod, ast.Div)) and right == 0:
            raise ForgeError(f"expression {text!r} divides by zero", "check the size variables it uses")
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env, text)
        return -v if isinstance(node.op, ast.USub) else (+v if isinstance(node.op, ast.UAdd) else (not v))
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, env, text) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, text)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env, text)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env, text) if _eval(node.test, env, text) else _eval(node.orelse, env, text)
    if isinstance(node, ast.Call):
        return _FUNCS[node.func.id](*[_eval(a, env, text) for a in node.args])  # type: ignore[union-attr]
    raise ForgeError(f"expression {text!r} is not allowed", "see docs/candidate-format.md")


def _read_text(path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ForgeError(f"the {what} file {path} is not UTF-8 text ({e.reason} at byte {e.start})",
                         "pass the source file itself, saved as UTF-8") from None


def load_candidate_files(source_path: str, spec_path: str | None, op: str, backend: str) -> Candidate:
    """Read a user's kernel file (and its spec, or a spec embedded in the source) into a Candidate.

    A spec may be embedded in the source between the lines ``/* forge-pack-spec`` and ``*/``.
    """
    from pathlib import Path

    src_file = Path(source_path)
    if not src_file.is_file():
        raise ForgeError(f"kernel file not found: {source_path}", "pass the path of a .cu or .cpp file")
    source = _read_text(src_file, "kernel")
    if spec_path:
        spec_file = Path(spec_path)
        if not spec_file.is_file():
            raise ForgeError(f"launch spec file not found: {spec_path}", "pass a JSON file with a 'kernels' list")
        spec_text = _read_text(spec_file, "launch spec")
    else:
        spec_text = extract_embedded_spec(source)
        if spec_text is None:
            raise ForgeError(f"{source_path} has no launch spec",
                             "embed one between '/* forge-pack-spec' and '*/', or pass --spec FILE")
    if backend not in BACKENDS:
        raise ForgeError(f"unknown backend {backend!r}", "use cuda or cpu")
    return Candidate(op=op, backend=backend, source=source, spec=parse_spec(spec_text), family="user",
                     origin="user")


def extract_embedded_spec(source: str) -> str | None:
    start = source.find("/* forge-pack-spec")
    if start < 0:
        return None
    end = source.find("*/", start)
    if end < 0:
        return None
    return source[start + len("/* forge-pack-spec"):end].strip()
