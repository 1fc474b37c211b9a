"""The TOML writer kovanex.toml (and every TOML file kovanex writes) is written with.

Python ships a TOML reader (tomllib) but no writer; these few functions cover what our
files hold: strings, numbers, booleans, arrays and inline tables.
"""

from __future__ import annotations

import json
from typing import Any


def toml_quote(s: str) -> str:
    """A TOML basic string: JSON's escapes (quotes, backslashes, newlines) are TOML's too."""
    return json.dumps(s, ensure_ascii=False)


def toml_value(v: Any) -> str:
    """Any value our files hold; a dict becomes an inline table, anything else a string."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return toml_array(v)
    if isinstance(v, dict):
        return toml_inline(v)
    return toml_quote(str(v))


def toml_array(items: list[Any]) -> str:
    return "[" + ", ".join(toml_value(i) for i in items) + "]"


def toml_inline(d: dict[str, Any]) -> str:
    if not d:
        return "{}"
    return (
        "{ " + ", ".join(f"{toml_quote(k)} = {toml_value(v)}" for k, v in sorted(d.items())) + " }"
    )
