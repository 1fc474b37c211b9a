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


HOOKS = ("pre-receive", "post-receive")
RELAY = "kovanex-relay.sh"  # their shared code, sourced from the hooks dir at run time


def install_hooks(repo: Path, data_dir: Path) -> None:
    """Write hooks with absolute paths baked in: no PATH lookups, no interpreter shims.

    Here, not in the CLI, because the agent installs hooks too (a replica it creates).
    Both hooks source `RELAY` from the hooks dir baked in as KX_HOOKS (as they run the
    slow path from there), so it must exist there, not in the repo."""
    src = hooks_dir()
    if not (src / RELAY).is_file():
        raise FileNotFoundError(f"{src / RELAY} missing; reinstall kovanex")
    for name in HOOKS:
        text = (src / name).read_text()
        text = text.replace("@KX_DATA@", str(data_dir))
        text = text.replace("@KX_PYTHON@", sys.executable)
        text = text.replace("@KX_HOOKS@", str(src))
        dst = repo / "hooks" / name
        dst.write_text(text)
        dst.chmod(0o755)
