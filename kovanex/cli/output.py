"""Shared CLI output: every listing takes `--format json`; errors say what to do next."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any


class CliError(Exception):
    """Printed as `kovanex: <message>` with exit status 1; the message names the next step."""


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def add_format(p: Any, choices: Sequence[str] = ("text", "json")) -> None:
    p.add_argument("--format", choices=list(choices), default="text", help="output format")
