"""Where the shipped hooks and templates live: in the wheel, or in the source checkout.

The repo keeps hooks/ and templates/ at its top; a built wheel carries copies as package
data in kovanex/_data/ (setup.py, ADR 0018). An editable install has no copies and reads
the checkout's folders. Both must be real directories: a hook runs
`kovanex_slowpath.py` by its absolute path, so a zipped install is not supported.
"""

from __future__ import annotations

import sys
from importlib.resources import files
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent
_MARKER = {"hooks": "pre-receive", "templates": "shell.toml"}


def _find(name: str) -> Path:
    shipped = Path(str(files("kovanex"))) / "_data" / name
    for base in (shipped, _CHECKOUT / name):
        if (base / _MARKER[name]).is_file():
            return base
    raise FileNotFoundError(
        f"kovanex {name}/ not found in {shipped} nor {_CHECKOUT / name}; "
        "reinstall kovanex (pip install kovanex-*.whl, or pip install -e . in a checkout)"
    )


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
