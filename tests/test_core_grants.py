"""Issue 12 part 2, the pure decider: the leader grants repos that hold absolute-consistency
work and re-places such tasks, only after a lease TTL, only while it leads, always with its
term; and the stores refuse a grant from an older term."""

from __future__ import annotations

from pathlib import Path

import pytest

from kovanex.core import grants
from kovanex.gitstate.ownership import (
    StaleOwnerTerm,
    newest_term,
    read_ownership,
    write_ownership,
)
from kovanex.gitstate.pygit2store import Pygit2Store
from kovanex.gitstate.store import StaleEpoch
from kovanex.testing import leader_view, member_views, node_state, ownership
from tests.agentkit import git

BANK = ownership("n1", 3, "n2,n3")


def dead_n1():
    """n2's view: bank's owner n1 died; n3 holds more of n1's refs than n2 does."""
    return node_state(
        "n2",
        member_views("n1 n3", n1="dead"),
        known={"bank": BANK, "web": ownership("n1", 1, "n2")},
        held={"bank": {"n2": 1, "n3": 2}},
        owner_tips={"bank": {"refs/heads/a": "x", "refs/heads/b": "y"}},
    )


def test_a_consistent_repo_of_a_dead_owner_is_granted_after_a_ttl_at_the_leaders_term() -> None:
    view = leader_view(dead_n1(), term=9, consistent=["bank"], gone_since={"n1": 100.0})
    assert grants.decide(view, 101.0) == []  # within the TTL the old owner may still run
    (g,) = grants.decide(view, 102.5)
    assert isinstance(g, grants.Grant)
    # n3 holds more of the owner's refs than n2 (the takeover rule's ranking), epoch + 1
    assert (g.repo, g.new.owner, g.new.epoch, g.term) == ("bank", "n3", 4, 9)
    assert g.old == BANK and "n3" not in g.new.replicas
    # "web" holds no consistent work: the gossip takeover rule keeps it
    assert all(e.repo != "web" for e in grants.decide(view, 200.0))


def test_only_the_leader_decides_and_never_twice() -> None:
    base = dict(term=9, consistent=["bank"], gone_since={"n1": 0.0})
    assert grants.decide(leader_view(dead_n1(), leads=False, **base), 50.0) == []
    assert grants.decide(leader_view(dead_n1(), term=0, leads=True, consistent=["bank"],
                                     gone_since={"n1": 0.0}), 50.0) == []  # fmt: skip
    (g,) = grants.decide(leader_view(dead_n1(), **base), 50.0)
    again = leader_view(dead_n1(), granted={"bank": g.new}, **base)
    assert grants.decide(again, 51.0) == []


def test_no_live_replica_no_grant() -> None:
    st = node_state("n9", member_views("n1 n2 n3", n1="dead", n2="dead", n3="left"),
                    known={"bank": BANK})  # fmt: skip
    view = leader_view(st, consistent=["bank"], gone_since={"n1": 0.0, "n2": 0.0, "n3": 0.0})
    assert grants.decide(view, 99.0) == []


def test_a_consistent_task_on_a_gone_runner_is_re_placed_by_its_owner_once_per_epoch() -> None:
    st = node_state("n2", member_views("n1 n3", n3="dead"), known={"bank": BANK})
    view = leader_view(
        st, term=5, consistent=["bank"], held=[("bank", "pay", "n3", 4)], gone_since={"n3": 10.0}
    )
    assert grants.decide(view, 12.0) == []  # n3 may still run it until it halts
    (r,) = grants.decide(view, 12.5)
    assert r == grants.Reschedule("bank", "pay", "n1", "n3", 4, 5)
    done = leader_view(st, term=5, consistent=["bank"], held=[("bank", "pay", "n3", 4)],
                       gone_since={"n3": 10.0}, rescheduled={("bank", "pay"): 4})  # fmt: skip
    assert grants.decide(done, 13.0) == []


def test_a_task_whose_owner_is_gone_waits_for_the_grant_first() -> None:
    view = leader_view(dead_n1(), consistent=["bank"], held=[("bank", "pay", "n1", 2)],
                       gone_since={"n1": 0.0})  # fmt: skip
    effects = grants.decide(view, 10.0)
    assert [type(e) for e in effects] == [grants.Grant]


def test_admit_refuses_an_older_term_or_none() -> None:
    assert grants.admit(4, 4) is None and grants.admit(4, 5) is None
    assert "older" in (grants.admit(5, 4) or "")
    assert "no leader term" in (grants.admit(0, 0) or "")


def test_the_ownership_record_carries_the_term_and_refuses_an_older_one(tmp_path: Path) -> None:
    git("init", "-q", "--bare", str(tmp_path / "r.git"))
    store = Pygit2Store(str(tmp_path / "r.git"))
    first = ownership("n1", 1, "n2,n3")
    write_ownership(store, first, None)
    assert newest_term(store) == 0
    second = ownership("n2", 2, "n3")
    write_ownership(store, second, first, term=7)
    assert newest_term(store) == 7
    msg = git("log", "-1", "--format=%B", "refs/kovanex/meta", cwd=tmp_path / "r.git").stdout
    assert "Kovanex-Term: 7" in msg
    # a deposed leader's late grant (term 6) is refused, even at a higher epoch
    with pytest.raises(StaleOwnerTerm) as e:
        write_ownership(store, ownership("n3", 3), second, term=6)
    assert isinstance(e.value, StaleEpoch)  # every `except StaleEpoch` stands it down
    assert read_ownership(store) == second
    write_ownership(store, ownership("n3", 3), second, term=8)
    assert newest_term(store) == 8
