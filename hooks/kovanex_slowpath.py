"""Hook fallback when the agent is not reachable: same verdict, slower start.

Runs with the node's absolute interpreter (written into the hook at
`kovanex repo create`), so importing kovanex, pygit2 and jsonschema is fine here.
"""

import os
import sys


def _beside() -> None:
    """A source checkout keeps hooks/ beside kovanex/: import that copy, the one the relay
    came with (-I leaves the repo dir, git's cwd, off sys.path; this dir is the node's)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(root, "kovanex", "__init__.py")):
        sys.path.insert(0, root)


def main() -> int:
    _beside()
    phase, data_dir = sys.argv[1], sys.argv[2]
    lines = [ln for ln in sys.stdin.read().splitlines() if ln.strip()]
    n = int(os.environ.get("GIT_PUSH_OPTION_COUNT", "0") or 0)
    opts = [os.environ.get(f"GIT_PUSH_OPTION_{i}", "") for i in range(n)]
    from kovanex.hook_fallback import run

    return run(phase, data_dir, os.getcwd(), os.environ.get("GIT_QUARANTINE_PATH"), lines, opts)


if __name__ == "__main__":
    sys.exit(main())
