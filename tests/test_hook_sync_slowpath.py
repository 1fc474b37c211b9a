"""The hooks' slow path (agent down) on the owner of a sync repo: a push is refused, since
only the agent can replicate it before it is acknowledged; other levels still queue it."""

from __future__ import annotations

from pathlib import Path

from kovanex.core.replication import Ownership
from kovanex.gitstate.ownership import read_ownership, write_ownership
from kovanex.gitstate.pygit2store import Pygit2Store
from tests.agentkit import Node, clone_with_task, git

SPEC = '[[steps]]\nname = "a"\nrun = "true"\n'


def set_level(node: Node, repo: str, level: str, wanted: int) -> None:
    store = Pygit2Store(str(node.repo(repo)))
    cur = read_ownership(store)
    epoch = cur.epoch if cur else 1
    new = Ownership(node.name, epoch, ("n2",) if wanted else (), level, wanted)
    write_ownership(store, new, cur)


def test_with_the_agent_down_a_sync_owner_refuses_a_push_and_an_async_one_queues_it(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path, "n1")  # never started: every push takes the slow path
    clone = clone_with_task(node, "vault", tmp_path / "c", "t1", SPEC)
    set_level(node, "vault", "sync", 1)
    push = git("push", "origin", "task/t1", cwd=clone, check=False)
    assert push.returncode != 0
    assert "sync replication: the agent on n1 is not answering" in push.stderr, push.stderr
    assert "kovanex agent --data" in push.stderr  # what to do next
    refs = git("for-each-ref", "--format=%(refname)", cwd=node.repo("vault")).stdout
    assert "task/t1" not in refs  # nothing moved
    set_level(node, "vault", "async", 1)
    push = git("push", "origin", "task/t1", cwd=clone, check=False)
    assert push.returncode == 0, push.stderr
    assert "starts when the agent does" in push.stderr
