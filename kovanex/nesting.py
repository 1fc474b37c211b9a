"""How deep a TOML or JSON text nests, measured before a recursive parser sees it.

tomllib and json recurse once per level of `[`/`{`, and jsonschema and repr recurse over
what they built: a spec nested 50,000 deep, well under the size limit, ended in a
RecursionError traceback in the pusher's terminal and a 500 from the API (issue 24). For
TOML (pure Python, and quadratic in a dotted key's length) one linear scan over the text,
strings and comments skipped so a bracket inside a string does not count, refuses it
first; `check_doc` walks a parsed document without recursion, for the depth a TOML
header and dotted keys add up to, and for JSON, which C's json parses fast (its own
RecursionError is the refusal past the interpreter's limit). Stdlib only: the hooks'
slow path imports it.
"""

from __future__ import annotations

import re
from typing import Any

# One token at a time: a dotted key (each dot is one more level, and tomllib's cost grows
# with the square of a key's length: 50,000 segments took it 51 s), a string (TOML's four
# kinds), a comment, or a bracket.
_SEG = r"""[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*'"""
_TOML_TOKENS = re.compile(
    rf"(?P<chain>(?:{_SEG})(?:[ \t]*\.[ \t]*(?:{_SEG}))+)"
    r'|"""(?:[^"\\]|\\.|"(?!""))*"""'  # multi-line basic string
    r"|'''.*?'''"  # multi-line literal string
    r'|"(?:[^"\\\n]|\\.)*"'  # basic string
    r"|'[^'\n]*'"  # literal string
    r"|#[^\n]*"  # comment
    r"|[\[\]{}]",
    re.S,
)
_SEGS = re.compile(_SEG)
_OPEN = frozenset("[{")
_CLOSE = frozenset("]}")


class TooDeep(ValueError):
    """Nested deeper than the limit; `line` is 1-based, 0 when not known (a parsed doc)."""

    def __init__(self, limit: int, line: int = 0, where: str = "") -> None:
        at = f" at line {line}" if line else (f" at {where}" if where else "")
        super().__init__(
            f"nested deeper than {limit} levels{at}; the limit is {limit} (limits.nesting_depth)"
        )
        self.limit = limit
        self.line = line


def _scan(text: str, tokens: re.Pattern[str], limit: int) -> None:
    """Raise TooDeep at the first token that goes deeper than `limit`."""
    depth = 0
    for m in tokens.finditer(text):
        tok = m.group()
        if m.lastgroup == "chain":  # a.b.c: as deep as its segments, where it stands
            if depth + len(_SEGS.findall(tok)) - 1 > limit:
                raise TooDeep(limit, text.count("\n", 0, m.start()) + 1)
        elif tok in _OPEN:
            depth += 1
            if depth > limit:
                raise TooDeep(limit, text.count("\n", 0, m.start()) + 1)
        elif tok in _CLOSE:
            depth = max(depth - 1, 0)


def check_toml(text: str, limit: int) -> None:
    """Raise TooDeep when brackets in `text` nest deeper than `limit` (before tomllib)."""
    _scan(text, _TOML_TOKENS, limit)


def doc_depth_path(doc: Any, limit: int, root_level: int = 1) -> str | None:
    """The dotted path where a parsed document first goes deeper than `limit`, or None.
    Iterative, so a document as deep as dotted keys can make it costs no recursion.
    `root_level` 0: the root is no level (a TOML file's implicit table), as in the scan."""
    stack: list[tuple[Any, int, str]] = [(doc, root_level - 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, dict):
            items: Any = ((str(k), v) for k, v in node.items())
        elif isinstance(node, list):
            items = ((f"[{i}]", v) for i, v in enumerate(node))
        else:
            continue
        if depth >= limit:
            return path or "(root)"
        for key, child in items:
            sub = f"{path}{key}" if key.startswith("[") else (f"{path}.{key}" if path else key)
            stack.append((child, depth + 1, sub))
    return None


def check_doc(doc: Any, limit: int, root_level: int = 1) -> None:
    """Raise TooDeep naming the first path that nests deeper than `limit`."""
    where = doc_depth_path(doc, limit, root_level)
    if where is not None:
        raise TooDeep(limit, where=_short(where))


def _short(path: str, keep: int = 60) -> str:
    return path if len(path) <= keep else path[:keep] + "..."
