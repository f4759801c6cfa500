"""The source of a function or class defined in a notebook cell, and the globals it uses.

IPython keeps every executed cell in `linecache` under the file name its code objects
carry, so a definition's text is found by parsing that cell and picking the top-level
`def` or `class` that starts where the code says it does. A definition nested in another
function, or one whose cell text is gone, has no `Definition`: it travels by value.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass
class Definition:
    """A top-level `def` or `class` statement, as the notebook wrote it."""

    name: str
    source: str
    filename: str
    line: int
    # Names the statement itself evaluates (decorators, defaults, annotations, bases):
    # they must exist before it runs. The others are only looked up when it is called.
    needed_at_definition: set[str] = field(default_factory=set)
    needed_at_call: set[str] = field(default_factory=set)


def code_of(obj: Any) -> CodeType | None:
    """The code object behind a function, a `tf.function` or a `functools.wraps` wrapper."""
    fn = getattr(obj, "python_function", obj)  # tf.function keeps the original here
    try:
        fn = inspect.unwrap(fn)
    except ValueError:
        return None
    return getattr(fn, "__code__", None)


def method_codes(cls: type) -> list[CodeType]:
    """The code of the methods written in a class body (not inherited ones)."""
    codes = []
    for member in vars(cls).values():
        if isinstance(member, staticmethod | classmethod):
            member = member.__func__
        elif isinstance(member, property):
            member = member.fget
        code = code_of(member) if member is not None else None
        if code is not None:
            codes.append(code)
    return codes


def find_definition(obj: Any) -> Definition | None:
    """The definition of a notebook function or class, or None when it has no source."""
    if inspect.isclass(obj):
        codes = method_codes(obj)
        name = obj.__name__
    else:
        code = code_of(obj)
        codes = [code] if code is not None else []
        name = getattr(code, "co_name", "")
    if not codes or name in ("<lambda>", ""):
        return None
    filename = codes[0].co_filename
    text = "".join(linecache.getlines(filename))
    if not text:
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in tree.body:
        if getattr(node, "name", None) != name:
            continue
        start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        if isinstance(node, _DEFS):
            if start != codes[0].co_firstlineno:
                continue
            at_definition = _loads(_evaluated_by_def(node))
            at_call = (_loads(node.body) & _global_names(codes[0])) - _locals(codes[0])
        elif isinstance(node, ast.ClassDef):
            if not any(start <= c.co_firstlineno <= node.end_lineno for c in codes):
                continue
            methods = [n for n in node.body if isinstance(n, _DEFS)]
            others = [n for n in node.body if n not in methods]
            at_definition = _loads(
                [*node.decorator_list, *node.bases, *node.keywords, *others]
                + [part for m in methods for part in _evaluated_by_def(m)]
            )
            names_in_methods = set().union(*(_global_names(c) for c in codes))
            at_call = _loads([part for m in methods for part in m.body]) & names_in_methods
            at_call -= set().union(*(_locals(c) for c in codes))
        else:
            continue
        source = textwrap.dedent("".join(text.splitlines(True)[start - 1 : node.end_lineno]))
        return Definition(name, source, filename, start, at_definition, at_call)
    return None


def _evaluated_by_def(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """The parts of a `def` evaluated when the statement runs, not when it is called."""
    args = node.args
    annotations = [
        a.annotation
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        if a is not None and a.annotation is not None
    ]
    parts = [*node.decorator_list, *args.defaults, *annotations]
    parts += [d for d in args.kw_defaults if d is not None]
    if node.returns is not None:
        parts.append(node.returns)
    return parts


def _loads(nodes: list[ast.AST]) -> set[str]:
    """Every plain name read inside the given nodes."""
    names = set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                names.add(sub.id)
    return names


def _global_names(code: CodeType) -> set[str]:
    """Names a code object (and the functions nested in it) may look up as globals.
    `co_names` also holds attribute names; intersected with the names the source reads
    plainly, it leaves the globals, without counting a local that shadows one."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= _global_names(const)
    return names


def _locals(code: CodeType) -> set[str]:
    """Names a function binds itself (arguments, assignments, `import x` inside it):
    `co_names` lists a local import's module name too, but it is no global."""
    return set(code.co_varnames) | set(code.co_cellvars)
