"""Issue 24 part 3: limits on everything a push carries, refused at pre-receive with the
limit named and nothing written; specs and API bodies nested 50,000 deep are a clear
refusal (4xx), never a RecursionError traceback or a 500."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

from kovanex import nesting
from kovanex import spec as specmod
from kovanex.inputlimits import KIB, MIB, InputLimits
from tests.agentkit import Node, clone_with_task, git
from tests.test_api import client, raw

OK_STEP = '[[steps]]\nname = "a"\nrun = "true"\n'
DEEP_ARRAY = "x = " + "[" * 50_000 + "]" * 50_000 + "\n" + OK_STEP  # ~100 KB: under 256 KiB
DEEP_TABLE = "x = " + "{a = " * 30_000 + "1" + "}" * 30_000 + "\n" + OK_STEP
DEEP_API = "x = " + "[" * 30_000 + "]" * 30_000 + "\n" + OK_STEP  # SubmitTask: spec <= 64 KiB
DEEP_KEYS = "a" + ".a" * 50_000 + " = 1\n" + OK_STEP  # no bracket: tomllib took 51 s on it
TIGHT = {"push_commits": 5, "object_bytes": 1 * MIB, "pack_bytes": 2 * MIB}


def with_limits(node: Node, **limits: int) -> Node:
    """The node's kovanex.toml gets a [limits] table, as an operator would write it."""
    cfg = node.data / "kovanex.toml"
    table = "".join(f"{k} = {v}\n" for k, v in limits.items())
    cfg.write_text(cfg.read_text() + "\n[limits]\n" + table)
    return node


@pytest.fixture(scope="module", params=["agent", "hook-only"])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The fast path (the agent answers the hook) and the slow path (agent down): same verdict.
    One node per path for the module (limits are the node's): each test pushes to a repo
    of its own (`repo`), so what one test wrote is never in another's way."""
    root = tmp_path_factory.mktemp("lim")
    n = with_limits(Node(root, f"lim-{secrets.token_hex(3)}"), **TIGHT)
    if request.param == "agent":
        n.start()
    yield n
    n.stop()


@pytest.fixture
def repo() -> str:
    """A repo name of this test's own on the shared node."""
    return f"r-{secrets.token_hex(4)}"


def refused(node: Node, repo: str, clone: Path, named: str, ref: str = "task/big") -> str:
    """Push and check the refusal: the limit named, no traceback, and nothing written."""
    tip = git("rev-parse", "HEAD", cwd=clone).stdout.strip()
    push = git("push", "origin", f"HEAD:refs/heads/{ref}", cwd=clone, check=False)
    assert push.returncode != 0, push.stderr
    assert named in push.stderr, push.stderr
    assert "Traceback" not in push.stderr and "RecursionError" not in push.stderr, push.stderr
    refs = git("for-each-ref", "--format=%(refname)", cwd=node.repo(repo)).stdout
    assert ref not in refs
    assert git("cat-file", "-e", tip, cwd=node.repo(repo), check=False).returncode != 0
    return push.stderr


def test_defaults_are_the_documented_ones() -> None:
    d = InputLimits()
    assert (d.message_bytes, d.push_commits, d.object_bytes) == (64 * KIB, 1000, 50 * MIB)
    assert (d.pack_bytes, d.nesting_depth) == (128 * MIB, 64)
    assert d.pack_bytes >= d.object_bytes  # an object within its limit fits in a pack


def test_a_20mb_commit_message_is_refused_naming_the_64k_limit(
    node: Node, repo: str, tmp_path: Path
) -> None:
    clone = clone_with_task(node, repo, tmp_path / "c", "big", OK_STEP)
    msg = tmp_path / "msg"
    msg.write_text("subject\n\n" + "x" * (20 * MIB))
    git("commit", "-q", "--allow-empty", "-F", str(msg), cwd=clone)
    err = refused(
        node, repo, clone, "its message is 20.0 MiB; the limit is 64 KiB (limits.message_bytes)"
    )
    assert err.count("limits.message_bytes") == 1
    # a message just within the limit goes through
    git("reset", "-q", "--hard", "HEAD~1", cwd=clone)
    msg.write_text("subject\n\n" + "x" * (64 * KIB - 10))
    git("commit", "-q", "--allow-empty", "-F", str(msg), cwd=clone)
    assert git("push", "origin", "task/big", cwd=clone).returncode == 0


def test_more_commits_than_the_limit_are_refused(node: Node, repo: str, tmp_path: Path) -> None:
    clone = clone_with_task(node, repo, tmp_path / "c", "big", OK_STEP)
    for i in range(5):
        git("commit", "-q", "--allow-empty", "-m", f"c{i}", cwd=clone)
    refused(node, repo, clone, "this push carries 6 commits; the limit is 5 commits per push "
            "(limits.push_commits)")  # fmt: skip
    push = git("push", "origin", "HEAD~1:refs/heads/task/big", cwd=clone, check=False)
    assert push.returncode == 0, push.stderr  # five: within the limit


def test_an_object_over_the_limit_is_refused(node: Node, repo: str, tmp_path: Path) -> None:
    blob = "y" * (1 * MIB + 1)  # compresses to nothing: the pack is small, the object not
    clone = clone_with_task(node, repo, tmp_path / "c", "big", OK_STEP, {"big.txt": blob})
    refused(node, repo, clone, "is 1.0 MiB; the limit is 1 MiB per object (limits.object_bytes)")


def test_a_pack_over_the_limit_is_refused_by_git_itself(
    node: Node, repo: str, tmp_path: Path
) -> None:
    """limits.pack_bytes is receive.maxInputSize, set on the repo at `repo create` and at
    agent start: git stops reading the pack before any hook runs."""
    clone = clone_with_task(node, repo, tmp_path / "c", "big", OK_STEP)
    for i in range(3):  # three incompressible 900 KB files: each within object_bytes
        (clone / f"r{i}.bin").write_bytes(os.urandom(900 * KIB))
    git("add", "-A", cwd=clone)
    git("commit", "-q", "-m", "random", cwd=clone)
    conf = git("config", "receive.maxInputSize", cwd=node.repo(repo)).stdout.strip()
    assert conf == str(2 * MIB)
    refused(node, repo, clone, "pack exceeds maximum allowed size")


@pytest.mark.parametrize(
    "text", [DEEP_ARRAY, DEEP_TABLE, DEEP_KEYS], ids=["array", "table", "keys"]
)
def test_a_spec_nested_50000_deep_is_refused_without_a_traceback(
    node: Node, repo: str, tmp_path: Path, text: str
) -> None:
    assert len(text.encode()) < 256 * KIB  # under the size limit: depth is what refuses it
    clone = clone_with_task(node, repo, tmp_path / "c", "big", text)
    err = refused(node, repo, clone, "nested deeper than 64 levels")
    assert "(limits.nesting_depth)" in err


def test_nesting_is_measured_outside_strings_and_comments() -> None:
    ok = 'description = "[[[[[[{{{{ a.b.c.d.e.f"\n# [[[[[[[[\n' + OK_STEP
    assert specmod.validate(ok.encode(), limits=InputLimits(nesting_depth=3)) == []
    deep = "x = [[[[1]]]]\n" + OK_STEP
    err = specmod.validate(deep.encode(), limits=InputLimits(nesting_depth=3))
    assert [e.reason for e in err] == [
        "nested deeper than 3 levels at line 1; the limit is 3 (limits.nesting_depth)"
    ]
    # tables from a header and dotted keys add up: the parsed document is measured too
    mixed = "[a.b]\nc = {d.e = 1}\n" + OK_STEP
    assert (
        "at a.b.c.d"
        in specmod.validate(mixed.encode(), limits=InputLimits(nesting_depth=3))[0].reason
    )
    with pytest.raises(nesting.TooDeep, match="deeper than 64 levels at line 1"):
        nesting.check_toml("x = " + "[" * 50_000, 64)
    with pytest.raises(nesting.TooDeep, match=r"deeper than 3 levels at a\.b\[0\]"):
        nesting.check_doc({"a": {"b": [[{"c": 1}]]}}, 3)
    assert nesting.doc_depth_path({"a": {"b": [1]}}, 3) is None


@pytest.fixture(scope="module")
def api_node(tmp_path_factory: pytest.TempPathFactory):
    n = with_limits(
        Node(tmp_path_factory.mktemp("lim"), f"api-{secrets.token_hex(3)}"),
        api_body_bytes=256 * KIB,
    )
    n.start()
    yield n
    n.stop()


def test_api_answers_a_spec_nested_30000_deep_with_a_400_naming_the_limit(
    api_node: Node, tmp_path: Path
) -> None:
    api_node.kx("repo", "create", "demo")
    from kovanex.client import ApiError

    with pytest.raises(ApiError) as e:
        client(api_node).call("SubmitTask", {"repo": "demo", "id": "deep", "spec": DEEP_API})
    assert e.value.status == 400, e.value
    assert "nested deeper than 64 levels" in str(e.value), e.value
    assert "Traceback" not in str(e.value) and "RecursionError" not in str(e.value)


def test_api_body_nested_50000_deep_is_a_400_and_an_oversized_body_a_413(
    api_node: Node,
) -> None:
    auth = {"Authorization": f"Bearer {client(api_node).token}", "Content-Type": "application/json"}
    body = b'{"addrs": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    st, _, data = raw(api_node, "POST", "/v1/cluster/join", body, auth)
    doc = json.loads(data)
    assert st == 400, data[:500]
    assert doc["field"] == "body" and "nested deeper than 64 levels" in doc["message"], doc
    assert "(limits.nesting_depth)" in doc["message"]
    st, _, data = raw(api_node, "POST", "/v1/cluster/join", b" " * (257 * KIB), auth)
    assert st == 413, data[:500]
    assert "the limit of 256 KiB (limits.api_body_bytes)" in json.loads(data)["message"]
    st, _, data = raw(api_node, "GET", "/healthz")
    assert st == 200  # the agent is still answering
