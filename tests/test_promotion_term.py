"""When coordination is on, `env/<name>` moves only under the leader's term: a release
commit records it (`Kovanex-Term`), a writer with an older term or no quorum stands down."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pygit2

from kovanex.core import promotion as pcore
from kovanex.core import promotion_state as ps
from kovanex.gitstate import refs, releases
from kovanex.gitstate.pygit2store import Pygit2Store

AUTHOR = ("kovanex", "kovanex@localhost")


def _freight(path: Path) -> str:
    repo = pygit2.init_repository(str(path), bare=True)
    tree = repo.TreeBuilder().write()
    sig = pygit2.Signature(*AUTHOR)
    return str(repo.create_commit(None, sig, sig, "v1", tree, []))


def test_a_release_commit_records_the_term_and_the_next_writer_reads_it(tmp_path: Path) -> None:
    freight = _freight(tmp_path / "r.git")
    store = Pygit2Store(str(tmp_path / "r.git"))
    rec = ps.Record("prod", "v1", (), None)
    move = ps.MoveEnv("prod", "v1", freight, None, (("Kovanex-Version", "v1"),), rec)
    oid = releases.env_commit(store, move, AUTHOR, epoch=3, now=1.0, term=7)
    store.cas_ref(refs.env_ref("prod"), oid, None)
    assert releases.term_of(store, "prod") == 7
    assert releases.owner_epoch_of(store, "prod") == 3
    log = subprocess.run(
        ["git", "-C", str(tmp_path / "r.git"), "log", "-1", "--format=%B", "env/prod"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "Kovanex-Term: 7" in log and "Kovanex-Owner-Epoch: 3" in log
    # on the gossip backend (term 0) no term trailer is written
    oid0 = releases.env_commit(store, move, AUTHOR, epoch=3, now=1.0, term=0)
    assert "Kovanex-Term" not in store.read_commit(oid0).message


def test_stand_down_refuses_older_epochs_older_terms_and_no_quorum() -> None:
    assert pcore.stand_down(epoch=2, held_epoch=2, term=5, held_term=5) is None
    assert pcore.stand_down(epoch=2, held_epoch=2, term=0, held_term=0) is None  # gossip
    assert "owner epoch 3" in (pcore.stand_down(2, 3, 5, 5) or "")
    assert "no quorum" in (pcore.stand_down(2, 2, None, 0) or "")
    assert "leader term 6 > ours 5" in (pcore.stand_down(2, 2, 5, 6) or "")
