"""Source text for the functions that travel by value, so AutoGraph can still read it.

cloudpickle ships a function without its source (it even renames its file to
'<dynamic-code>'), and TensorFlow's AutoGraph reads a function's source to convert its
Python control flow. The bundle therefore carries the text of the file (or notebook cell)
each by-value function came from, and the job puts it back into `linecache` under the
function's own file name before the function is used.
"""

from __future__ import annotations

import linecache
from collections.abc import Mapping
from typing import Any

from elasticdl_nb.capture.definitions import code_of


def sources_of(functions: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """{'files': {filename: text}, 'functions': {name: filename}} for those with a source."""
    files: dict[str, str] = {}
    where: dict[str, str] = {}
    for name, fn in functions.items():
        code = code_of(fn) if callable(fn) else None
        lines = linecache.getlines(code.co_filename) if code else []
        if lines and _defines(lines, code):
            where[name] = code.co_filename
            files[code.co_filename] = "".join(lines)
    return {"files": files, "functions": where}


def _defines(lines: list[str], code) -> bool:
    """Whether `lines` still hold the function where its code says it starts. A module
    file edited after it was imported no longer does; shipping that text would make
    AutoGraph convert other code than the function's (without a source, it leaves the
    function unconverted, which is right for everything but Python control flow on
    tensors)."""
    first = code.co_firstlineno - 1
    if first >= len(lines):
        return False
    if code.co_name == "<lambda>":
        return "lambda" in lines[first]
    if not lines[first].lstrip().startswith(("@", "def ", "async def ")):
        return False
    for line in lines[first : first + 50]:  # past the decorators, to the def itself
        text = line.lstrip()
        if text.startswith(("def ", "async def ")):
            return text.split("def ", 1)[1].startswith(f"{code.co_name}(")
    return False


def restore_sources(namespace: Mapping[str, Any], sources: dict[str, dict[str, str]]) -> None:
    """Put the shipped text back where AutoGraph (through linecache) looks for it."""
    for filename, text in sources["files"].items():
        if not linecache.getlines(filename):
            # mtime None: linecache never drops the entry for a file it cannot stat.
            linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    for name, filename in sources["functions"].items():
        fn = namespace.get(name)
        if fn is not None and hasattr(fn, "__code__"):
            fn.__code__ = fn.__code__.replace(co_filename=filename)
