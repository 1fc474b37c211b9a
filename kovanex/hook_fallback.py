"""The hooks' slow path: used only when the agent does not answer."""

from __future__ import annotations

import os
import sys

from kovanex import config as cfgmod
from kovanex.gitstate.ledger import TaskLedger
from kovanex.gitstate.ownership import BadOwnership
from kovanex.gitstate.pygit2store import Pygit2Store, http_pusher
from kovanex.inputlimits import InputLimits
from kovanex.pushcheck import (
    PUSH_VIA,
    STAGING_PREFIX,
    PushOptions,
    RefUpdate,
    broken_refusal,
    check_pre_receive,
    keep_pusher_log,
    record_push,
)


def run(
    phase: str,
    data_dir: str,
    git_dir: str,
    quarantine: str | None,
    lines: list[str],
    opts: list[str],
) -> int:
    updates = [RefUpdate.parse(ln) for ln in lines]
    options = PushOptions.parse(opts)
    options.pusher = http_pusher(
        os.environ.get("GIT_COMMITTER_NAME"), os.environ.get("GIT_COMMITTER_EMAIL")
    )
    options.from_node = os.environ.get(PUSH_VIA) == "node"
    try:
        cfg = cfgmod.load(cfgmod.Layout(cfgmod.data_dir(data_dir)))
        node, limits, coord = cfg.name, cfg.limits, cfg.coordination
    except cfgmod.ConfigError:
        node, limits, coord = "hook", InputLimits(), None
    if phase == "pre-receive":
        try:
            refusal = _sync_refusal(git_dir, node, updates, data_dir)
        except BadOwnership as e:
            refusal = broken_refusal(os.path.basename(git_dir).removesuffix(".git"), str(e), node)
        if refusal:
            print(refusal, file=sys.stderr)
            return 1
        verdict = check_pre_receive(
            git_dir,
            quarantine,
            updates,
            options,
            node=node,
            owner_url=_owner_url(git_dir, node),
            limits=limits,
            coordination=coord,
        )
        for m in verdict.messages:
            print(m, file=sys.stderr)
        if verdict.ok:
            keep_pusher_log(git_dir, updates)
        return 0 if verdict.ok else 1
    ledger = TaskLedger(Pygit2Store(git_dir), node=node)
    for task_id, what in record_push(ledger, updates, options, limits):
        print(
            f"kovanex: task {task_id} {what}; the agent is not running, so it starts when "
            f"the agent does: kovanex agent --data {data_dir}",
            file=sys.stderr,
        )
    return 0


def _sync_refusal(git_dir: str, node: str, updates: list[RefUpdate], data_dir: str) -> str:
    """A sync repo acknowledges a push only once its replicas hold it, and only the agent
    can replicate: with the agent down its owner refuses the push rather than acknowledge
    a write no replica has (staging writes, which replicate, are not user pushes)."""
    from kovanex.gitstate.ownership import read_ownership

    own = read_ownership(Pygit2Store(git_dir))
    if own is None or own.owner != node or own.level != "sync" or not own.replicas_wanted:
        return ""
    if all(u.ref.startswith(STAGING_PREFIX) for u in updates):
        return ""
    return (
        f"kovanex: sync replication: the agent on {node} is not answering, so the push "
        f"cannot reach the {own.replicas_wanted} replicas it needs before it is "
        f"acknowledged; it was refused and nothing moved. Start the agent "
        f"(kovanex agent --data {data_dir}) and push again."
    )


def _owner_url(git_dir: str, node: str):
    """With the agent down, the ownership record in refs/kovanex/meta still decides."""

    def check() -> str | None:
        from kovanex.gitstate.ownership import read_ownership

        own = read_ownership(Pygit2Store(git_dir))
        if own is None or own.owner == node:
            return None
        return f"the owner {own.owner} (see `kovanex members` for its http address)"

    return check
