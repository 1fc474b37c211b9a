"""Issue 9 part 2: user tokens, separate from the cluster secret, checked by scope."""

from __future__ import annotations

import json
import time
import tomllib
from pathlib import Path

import pytest

from kovanex.tokens import (
    PREFIX,
    Refused,
    TokenBook,
    TokenError,
    TokenRecord,
    newer,
    parse_duration,
)
from tests.agentkit import Node, git, trailers_of, wait_for

SPEC = '[[steps]]\nname = "a"\nrun = "echo hi"\n'


# -- the book, in process ---------------------------------------------------------------
def test_a_token_is_shown_once_and_only_its_digest_is_kept(tmp_path: Path) -> None:
    book = TokenBook(tmp_path / "tokens.json")
    rec, token = book.create("ci", "push", repos="demo*")
    assert token.startswith(PREFIX) and len(token) > 40
    assert token not in (tmp_path / "tokens.json").read_text()
    assert (tmp_path / "tokens.json").stat().st_mode & 0o777 == 0o600
    assert book.verify(token) == rec
    assert rec.grants("read", "demo-1") and rec.grants("push", "demo")
    assert not rec.grants("admin") and not rec.grants("read", "other")
    with pytest.raises(Refused, match="unknown token"):
        book.verify(PREFIX + "nope")
    with pytest.raises(TokenError, match="names are never reused"):
        book.create("ci", "read")


def test_revoked_and_expired_tokens_are_refused_by_name_without_the_secret(tmp_path: Path) -> None:
    book = TokenBook(tmp_path / "tokens.json")
    _, t1 = book.create("old", "read", expires_in=60, now=time.time() - 120)
    _, t2 = book.create("gone", "admin")
    book.revoke("gone")
    for token, name, word in ((t1, "old", "expired"), (t2, "gone", "revoked")):
        with pytest.raises(Refused) as e:
            book.verify(token)
        assert f"token {name}" in str(e.value) and word in str(e.value)
        assert token not in str(e.value)
    # another process (the CLI) revokes: the agent's book sees it at the next request
    _, t3 = book.create("live", "push")
    TokenBook(tmp_path / "tokens.json").revoke("live")
    with pytest.raises(Refused, match="token live was revoked"):
        book.verify(t3)


def test_a_damaged_record_grants_nothing_and_the_rest_still_work(tmp_path: Path) -> None:
    book = TokenBook(tmp_path / "tokens.json")
    _, good = book.create("good", "read")
    doc = json.loads((tmp_path / "tokens.json").read_text())
    doc["tokens"].append({"name": "bad", "scope": "root", "digest": "x"})
    (tmp_path / "tokens.json").write_text(json.dumps(doc))
    assert book.verify(good).name == "good"
    assert [r.name for r in book.records()] == ["good"]
    (tmp_path / "tokens.json").write_text("{not json")
    with pytest.raises(Refused, match="unknown token"):  # fails closed
        book.verify(good)


def test_revocation_wins_when_two_views_of_a_record_meet() -> None:
    a = TokenRecord("x", "push", "d1", created=10.0)
    r = TokenRecord("x", "push", "d1", created=10.0, revoked=20.0)
    later = TokenRecord("x", "admin", "d2", created=30.0)
    assert newer(a, r) == r and newer(r, a) == r and newer(r, later) == r
    assert newer(a, later) == later and newer(None, a) == a


def test_durations_parse_or_are_refused_with_the_forms_that_work() -> None:
    assert parse_duration("90d") == 90 * 86400 and parse_duration("12h") == 43200
    for bad in ("", "10", "-1d", "3y"):
        with pytest.raises(TokenError, match="30m, 12h, 90d, 2w"):
            parse_duration(bad)


# -- a real agent, real git over HTTP ------------------------------------------------------
def http_base(node: Node) -> str:
    bind = tomllib.loads((node.data / "kovanex.toml").read_text())["http"]["bind"]
    return f"http://{bind}"


def create(node: Node, *args: str) -> str:
    out = node.kx("token", "create", *args).stdout.strip().splitlines()
    return out[-1]  # the token alone on the last line


def commit_task(clone: Path, task: str) -> None:
    git("checkout", "-q", "-b", f"task/{task}", cwd=clone)
    (clone / ".kovanex").mkdir(exist_ok=True)
    (clone / ".kovanex" / "task.toml").write_text(SPEC)
    git("add", "-A", cwd=clone)
    git("commit", "-qm", task, cwd=clone)


def pushed_by(node: Node, task: str) -> str:
    wait_for(lambda: node.show(task)["state"] == "succeeded", 30, f"{task} to succeed")
    queued = [t for t in trailers_of(node.repo("demo"), f"task/{task}") if "Priority" in str(t)]
    return queued[0]["Kovanex-Pushed-By"]


def with_token(url: str, token: str, user: str = "anyone") -> str:
    return url.replace("http://", f"http://{user}:{token}@")


def test_scopes_over_git_http(node: Node, tmp_path: Path) -> None:
    printed = node.kx("repo", "create", "demo").stdout
    url = f"{http_base(node)}/git/demo.git"
    assert printed.strip().splitlines()[-1] == url  # the URL alone, with no secret in it
    ro, rw = create(node, "ro", "--scope", "read"), create(node, "ci", "--scope", "push")
    other = create(node, "elsewhere", "--scope", "push", "--repos", "other-*")

    # push with a push token (Basic, any user name): the task records who pushed it
    w = tmp_path / "w"
    git("clone", "-q", with_token(url, rw, "whoever"), str(w))
    commit_task(w, "t1")
    git("push", "-q", "origin", "task/t1", cwd=w)
    assert pushed_by(node, "t1") == "ci"
    # the hook handed the name over: a task branch keeps no reflog (ADR 0040)
    assert not (node.repo("demo") / "logs" / "refs" / "heads" / "task" / "t1").exists()

    # a read token clones, and its push is refused with a reason git prints
    r = tmp_path / "r"
    git("clone", "-q", with_token(url, ro), str(r))
    git("checkout", "-q", "-b", "task/t2", cwd=r)
    git("commit", "-q", "--allow-empty", "-m", "t2", cwd=r)
    p = git("push", "origin", "task/t2", cwd=r, check=False)
    assert p.returncode != 0
    assert "token ro has scope read; this needs push" in p.stderr, p.stderr
    assert ro not in p.stderr

    # bearer works as well as Basic
    bearer = git("-c", f"http.extraHeader=Authorization: Bearer {ro}", "ls-remote", url)
    assert "refs/heads/task/t1" in bearer.stdout

    # a token limited to other repos is refused here, naming the glob
    p = git("ls-remote", with_token(url, other), check=False)
    assert "limited to repos 'other-*'" in p.stderr, p.stderr

    # revoked: refused at the very next request, by name, secret never echoed
    node.kx("token", "revoke", "ci")
    p = git("ls-remote", with_token(url, rw), check=False)
    assert p.returncode != 0 and "token ci was revoked" in p.stderr, p.stderr
    assert rw not in p.stderr

    listed = json.loads(node.kx("token", "list", "--format", "json").stdout)
    assert {t["name"]: t["state"] for t in listed} == {
        "ci": "revoked",
        "elsewhere": "active",
        "local@n1": "active",
        "ro": "active",
    }
    # the secrets are nowhere in the node's data dir
    blob = b"".join(f.read_bytes() for f in node.data.rglob("*") if f.is_file())
    for t in (ro, rw, other):
        assert t.encode() not in blob


def test_the_printed_url_works_for_the_init_user_through_the_credential_helper(
    node: Node, tmp_path: Path
) -> None:
    printed = node.kx("repo", "create", "demo").stdout.strip().splitlines()[-1]
    assert printed == f"{http_base(node)}/git/demo.git"
    c = tmp_path / "c"
    git("clone", "-q", printed, str(c))  # git asks `kovanex credential`
    assert "kxu_" not in (c / ".git" / "config").read_text()
    commit_task(c, "mine")
    git("push", "-q", "origin", "task/mine", cwd=c)
    assert pushed_by(node, "mine") == "local@n1"


def test_a_local_path_push_is_recorded_as_the_node(node: Node, tmp_path: Path) -> None:
    node.kx("repo", "create", "demo")
    c = tmp_path / "c"
    git("clone", "-q", str(node.repo("demo")), str(c))
    commit_task(c, "path")
    git("push", "-q", "origin", "task/path", cwd=c)
    assert pushed_by(node, "path") == "local@n1"


@pytest.mark.slow
def test_a_token_made_on_one_node_works_on_another_and_so_does_its_revocation(
    tmp_path: Path,
) -> None:
    n1 = Node(tmp_path, "n1", "--profile", "local")
    value = (n1.data / "secrets" / "cluster.token").read_text().strip()
    n2 = Node(tmp_path, "n2", "--profile", "local", "--token", value)
    bind = tomllib.loads((n1.data / "kovanex.toml").read_text())["gossip"]["bind"]
    try:  # started inside: n1 must stop even when n2 cannot start
        n1.start()
        n2.start("--join", bind)
        n2.kx("repo", "create", "demo")
        url = f"{http_base(n2)}/git/demo.git"
        tok = create(n1, "shared", "--scope", "read")
        wait_for(
            lambda: git("ls-remote", with_token(url, tok), check=False).returncode == 0,
            30,
            "n2 to accept a token made on n1",
        )
        n1.kx("token", "revoke", "shared")
        wait_for(
            lambda: (
                "token shared was revoked"
                in git("ls-remote", with_token(url, tok), check=False).stderr
            ),
            30,
            "n2 to refuse the token revoked on n1",
        )
        # n2 kept what it learned: its own file says so, and survives a restart
        states = {
            t["name"]: t["state"]
            for t in json.loads(n2.kx("token", "list", "--format", "json").stdout)
        }
        assert states["shared"] == "revoked"
    finally:
        n2.stop()
        n1.stop()
