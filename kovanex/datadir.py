"""The node data dir: where each of a node's files lives, and the node's id in it.

The data dir is the whole of a node's local state: its bare repos, worktrees, live
logs and runtime files. Everything that matters beyond a restart is in the repos
themselves; the rest can be rebuilt. It imports nothing of kovanex: the node config
(`config.py`) and the cluster token (`clustertoken.py`) build on it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from secrets import token_hex


class ConfigError(Exception):
    """A bad or missing node config, data dir or cluster token; the message says what
    to run next."""


def data_dir(arg: str | None) -> Path:
    """`--data` beats `$KOVANEX_HOME`, which beats `~/.kovanex` (issue 2 contract)."""
    raw = arg or os.environ.get("KOVANEX_HOME") or "~/.kovanex"
    return Path(raw).expanduser().resolve()


@dataclass
class Layout:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "kovanex.toml"

    @property
    def repos(self) -> Path:
        return self.root / "repos"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def hook_endpoint(self) -> Path:
        """`<port> <token>`: where hooks reach the agent (see docs/decisions/0006)."""
        return self.run / "hook"

    @property
    def control_socket(self) -> Path:
        return self.run / "agent.sock"

    @property
    def pid_file(self) -> Path:
        return self.run / "agent.pid"

    @property
    def agent_log(self) -> Path:
        return self.root / "agent.log"

    @property
    def token_file(self) -> Path:
        return self.root / "secrets" / "cluster.token"

    @property
    def tokens_file(self) -> Path:
        """User token records (digests only): kovanex/tokens.py."""
        return self.root / "secrets" / "tokens.json"

    @property
    def local_token_file(self) -> Path:
        """The admin token `local@<node>` that `kovanex credential` hands to git."""
        return self.root / "secrets" / "local.token"

    @property
    def cordon_file(self) -> Path:
        """Present while the node is cordoned: a cordon outlives a restart, as Nomad's
        node eligibility does (an operator drained it for a reason)."""
        return self.root / "cordon.json"

    def repo(self, name: str) -> Path:
        return self.repos / f"{name}.git"

    @property
    def upkeep_file(self) -> Path:
        """When each repo was last archived and maintained (agent/upkeep.py)."""
        return self.root / "upkeep.json"

    def step_log(self, repo: str, task: str, index: int, step: str) -> Path:
        return self.logs / repo / task / f"{index}-{step}.log"

    @property
    def node_id_file(self) -> Path:
        """This node's identity on the host: random, made once, kept with the data dir."""
        return self.root / "node.id"


def no_node(layout: Layout, addr_hint: bool = False) -> str:
    """What every verb says when `--data` names no node (`addr_hint`: the verb takes
    `--addr`, so an agent elsewhere would do too)."""
    hint = ", or pass --addr http://HOST:PORT of a node's agent" if addr_hint else ""
    return (
        f"no node at {layout.root} (missing kovanex.toml); "
        f"run `kovanex init --data {layout.root} --name NAME` first{hint}"
    )


_NODE_ID = re.compile(r"^[0-9a-f]{16}$")


def node_id(layout: Layout) -> str:
    """The data dir's node id, made at first use (init, or the first load of an older
    node). Written aside, then linked into place: a racing load sees no file or a whole
    one, and the first link wins."""
    path = layout.node_id_file
    if not path.exists():
        tmp = path.with_name(f"node.id.{os.getpid()}.tmp")
        try:
            tmp.write_text(token_hex(8) + "\n")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        except OSError:
            return ""  # a read-only view of a node: keyed by name, as before
    text = path.read_text().strip()
    if not _NODE_ID.match(text):
        raise ConfigError(f"{path} holds {text[:40]!r}, not a node id; delete it to make one")
    return text
