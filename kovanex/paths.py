"""Where the shipped hooks and templates live (source checkout or installed data files)."""

from __future__ import annotations

import sys
from pathlib import Path

_SRC = Path(__file__).resolve().parent.parent


def _find(name: str) -> Path:
    for base in (_SRC / name, Path(sys.prefix) / "share" / "kovanex" / name):
        if base.is_dir():
            return base
    raise FileNotFoundError(f"kovanex {name}/ not found; reinstall with `pip install -e .`")


def hooks_dir() -> Path:
    return _find("hooks")


def templates_dir() -> Path:
    return _find("templates")
