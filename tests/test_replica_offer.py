"""The owner's offer endpoint (ADR 0069) between two real GitHttpServers on loopback: a
deposed owner's lost tips land as reconcile staging refs, objects first, and the owner is
told at once; a pack against tips the owner lacks is sent again against its own; only the
owner takes offers, and only reconcile staging refs."""

from __future__ import annotations

from pathlib import Path

from kovanex.core.replication import Ownership
from kovanex.gitstate import gitcli
from kovanex.gitstate.progress import Progress
from kovanex.gitstate.refs import RECONCILE, reconcile_ref
from tests.agentkit import fsck, git
from tests.test_replica_wire import MAIN, Side, commit, pair


def test_offer_lands_as_staging_refs_and_tells_the_owner(tmp_path: Path) -> None:
    async def go(o: Side, r: Side, owner_repo: Path, deposed_repo: Path) -> None:
        # `r` plays the deposed owner, `o` the new one
        o.rt.known["r"] = Ownership("owner", 2, (), "async", 1)
        told: list[str] = []
        o.wire.on_offered = told.append
        base = commit(owner_repo, MAIN, "base")
        git("fetch", "-q", str(owner_repo), f"{MAIN}:{MAIN}", cwd=deposed_repo)
        first = commit(deposed_repo, MAIN, "acked on the deposed side only")
        mine = commit(deposed_repo, MAIN, "and another")
        ours = commit(owner_repo, MAIN, "the new owner's own")
        ref = reconcile_ref(1, "replica", MAIN)
        # it believes the owner holds `first`: the thin pack leaves it out, the owner's
        # index-pack refuses it, and the resend against the owner's tips (409) lands
        progress = Progress(15.0, 60.0)
        ok, why = await r.wire.offer("r", o.srv.url, {ref: mine}, [first], progress)
        assert (ok, why) == (True, "")
        assert progress.moved > 0
        assert gitcli.for_each_ref(owner_repo, RECONCILE) == {ref: mine}
        assert gitcli.for_each_ref(owner_repo, "refs/heads/") == {MAIN: ours}
        assert gitcli.is_ancestor(owner_repo, base, mine)
        assert told == ["r"]
        fsck(owner_repo)

    pair(tmp_path, go)


def test_offer_to_a_node_that_does_not_own_the_repo_is_refused(tmp_path: Path) -> None:
    async def go(o: Side, r: Side, owner_repo: Path, deposed_repo: Path) -> None:
        o.rt.known["r"] = Ownership("someone-else", 3, (), "async", 1)
        mine = commit(deposed_repo, MAIN, "lost")
        ok, why = await r.wire.offer("r", o.srv.url, {reconcile_ref(1, "x", MAIN): mine}, [])
        assert not ok and "not the owner of r (it is someone-else)" in why
        assert gitcli.for_each_ref(owner_repo) == {}

    pair(tmp_path, go)


def test_offer_of_other_refs_is_refused(tmp_path: Path) -> None:
    async def go(o: Side, r: Side, owner_repo: Path, deposed_repo: Path) -> None:
        o.rt.known["r"] = Ownership("owner", 2, (), "async", 1)
        mine = commit(deposed_repo, MAIN, "lost")
        ok, why = await r.wire.offer("r", o.srv.url, {MAIN: mine}, [])
        assert (ok, why) == (False, "HTTP 400")
        assert gitcli.for_each_ref(owner_repo) == {}

    pair(tmp_path, go)
