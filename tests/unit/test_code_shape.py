"""The code stays readable in pieces: no module over 400 lines unless its docstring says
why, no function over 60 lines (product code and benchmarks; tests are exempt, since a
table of cases reads best in one place)."""

from __future__ import annotations

import ast

import pytest

from tests.paths import ROOT

MODULE_LINES = 400
FUNCTION_LINES = 60
#: A long module says so at the top of its docstring, with the reason.
LONG_MODULE_MARK = "Why this module is long:"
CHECKED = ("fedapp", "strategies", "clients", "benchmarks")


def python_files() -> list:
    return sorted(path for folder in CHECKED for path in (ROOT / folder).rglob("*.py"))


def long_functions(tree: ast.Module) -> list[str]:
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, from line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > FUNCTION_LINES
    ]


@pytest.mark.parametrize("path", python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_are_short(path):
    text = path.read_text()
    tree = ast.parse(text)
    lines = text.count("\n")
    if lines > MODULE_LINES:
        docstring = ast.get_docstring(tree) or ""
        assert LONG_MODULE_MARK in docstring, f"{lines} lines and no '{LONG_MODULE_MARK}' in its docstring"
    assert not long_functions(tree), f"functions over {FUNCTION_LINES} lines: {long_functions(tree)}"


def test_the_shape_check_finds_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    assert long_functions(ast.parse(f"def f():\n{body}\n")) == [f"f ({FUNCTION_LINES + 1} lines, from line 1)"]
