"""All SQL of forge-pack lives in forge_pack/store: no SQL text and no ``.execute(`` anywhere else."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "forge_pack"
STORE = PACKAGE / "store"

# Statements as forge-pack writes them (upper case, as SQL is spelled throughout the store).
SQL = re.compile(r"\b(SELECT\s|INSERT\s+(OR\s+\w+\s+)?INTO\s|UPDATE\s+\w+\s+SET\s|DELETE\s+FROM\s"
                 r"|CREATE\s+(TABLE|INDEX)\s|ALTER\s+TABLE\s|PRAGMA\s|BEGIN\s+IMMEDIATE\b)")
EXECUTE = {"execute", "executemany", "executescript"}


def sql_in(source: str) -> list[str]:
    """'line N: what' for every SQL string literal (docstrings aside) and every .execute() call."""
    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            m = SQL.search(node.value)
            if m:
                found.append(f"line {node.lineno}: SQL {node.value.strip()[:60]!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in EXECUTE:
            found.append(f"line {node.lineno}: .{node.func.attr}()")
    return found


def test_no_sql_outside_the_store_package():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if STORE in path.parents:
            continue
        found = sql_in(path.read_text())
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}, "SQL belongs behind a named function in forge_pack/store: " + repr(offenders)


def test_the_scan_finds_sql_in_strings_fstrings_and_execute_calls():
    src = ('"""SELECT in a docstring is prose."""\n'
           'def f(conn, cols):\n'
           '    rows = conn.execute("SELECT id FROM runs ORDER BY id DESC LIMIT 1")\n'
           '    more = f"SELECT {cols} FROM llm_calls WHERE node_id=?"\n'
           '    store.execute("UPDATE hotspots SET budget=? WHERE id=?", (1, "h"))\n')
    assert sql_in(src) == ["line 3: .execute()", "line 5: .execute()",
                           "line 3: SQL 'SELECT id FROM runs ORDER BY id DESC LIMIT 1'",
                           "line 4: SQL 'SELECT'", "line 5: SQL 'UPDATE hotspots SET budget=? WHERE id=?'"]


def test_the_store_package_itself_holds_sql():
    assert any(sql_in(p.read_text()) for p in STORE.glob("*.py"))
