"""The node's network policy for its units, put in place with nftables (ADR 0076).

The agent owns one table, `inet kovanex-<unit key>`: made (or replaced, after a crash)
in one `nft -f` transaction once its ports are known, again when the hook port is bound,
and deleted when it stops. Nothing runs per step. Where the policy cannot be enforced
(no units to match, not root, no `nft`, a kernel without nf_tables) the status line says
so in capitals and the agent log warns: never silently.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field

from kovanex import proc
from kovanex.core import netpolicy as core
from kovanex.runner import limits as limitsmod

_log = logging.getLogger("kovanex.units")
HOW = "nftables owner match on the units' uids"
INSTALL_HINT = "install nftables (`apt-get install nftables`, or `make test` as root)"
NFT_TIMEOUT_S = 30.0


def nft_binary() -> str | None:
    return shutil.which("nft", path=limitsmod._SYS_PATH)


@dataclass
class NetPolicy:
    """One node's rules: `apply` with its ports (idempotent), `remove` at stop."""

    key: str  # the node's unit key (units.unit_key)
    uids: list[int]
    egress: core.Egress
    why_not: str = ""  # set when the units give nothing to match (no units, namespace...)
    table: str = field(init=False)
    line: str = field(init=False)
    applied: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.table = core.table_name(self.key)
        self.line = self._not_enforced(self.why_not) if self.why_not else "not yet applied"

    def _not_enforced(self, why: str) -> str:
        return f"NOT enforced: units can reach the node's ports ({why}); egress {self.egress.text()} NOT enforced"

    def apply(self, ports: core.NodePorts) -> str:
        """Install or replace the rules; returns the status line (also kept in .line)."""
        if self.why_not:
            return self.line
        nft = nft_binary()
        if nft is None:
            why = f"no nft on this host; {INSTALL_HINT}"
        elif os.geteuid() != 0:
            why = "the agent is not root; nftables needs root"
        else:
            script = core.render(self.table, self.uids, ports, self.egress)
            p = _nft(nft, script)
            if p.returncode == 0:
                self.applied = True
                self.line = core.describe(ports, self.egress, f"{HOW}, table inet {self.table}")
                _log.info("network: %s", self.line)
                return self.line
            why = f"nft failed: {p.text('stderr').strip()[:300]}"
        was = self.line
        self.line = self._not_enforced(why)
        if was != self.line:
            _log.warning("network: %s", self.line)
        return self.line

    def remove(self) -> None:
        """Delete the node's table (at stop): nothing of ours stays in the host's rules."""
        nft = nft_binary()
        if not self.applied or nft is None:
            return
        script = f"add table inet {self.table}\ndelete table inet {self.table}\n"
        p = _nft(nft, script)
        if p.returncode != 0:
            _log.warning(
                "network: could not delete table inet %s: %s", self.table, p.text("stderr")
            )
        self.applied = False


def _nft(nft: str, script: str) -> proc.Done:
    """`nft -f -` with a deadline: a wedged nft must not hold the agent's start or stop;
    at the deadline it answers as a failed nft does (exit 124, the reason on stderr)."""
    try:
        return proc.run([nft, "-f", "-"], input=script.encode(), env=limitsmod.ROOT_ENV,
                        timeout=NFT_TIMEOUT_S)  # fmt: skip
    except OSError as e:  # ProcTimeout included
        return proc.Done([nft, "-f", "-"], 124, b"", str(e).encode())


def for_node(key: str, uids: list[int], egress: core.Egress, isolation: str) -> NetPolicy:
    """The node's policy; says at once, loudly, why it cannot be enforced when the units
    leave no uid of their own to match (steps run as the agent's user)."""
    if isolation.startswith("no runner slots"):
        policy = NetPolicy(key, [], egress, "this node runs no steps")
        policy.line = "no runner slots: this node runs no steps"
        return policy
    if uids:
        return NetPolicy(key, uids, egress)
    policy = NetPolicy(
        key, [], egress, "steps run as the agent's own user; no rule can tell them apart"
    )
    _log.warning("network: %s", policy.line)
    return policy
