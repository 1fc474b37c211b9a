"""Issue 13 with real agents on loopback: three nodes, one environment label each
(prod on the repo's owner, staging and dev on the others, as in the seed), real pushes
over git smart HTTP with user tokens, and real gate tasks placed by those labels.

Cases: a failing gate; a direct push to env/prod refused; two racing promotions; an
approval required and then given (self-approval refused); auto-rollback after a failed
deploy; a gate definition changed after a pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kovanex.testing import dev_staging_prod, environment, environments_toml, gate
from tests.agentkit import Node, git, trailers_of, wait_for

TOKEN = "t0ken-for-promotion-tests"
NAMES = {"pa13": "prod", "pb13": "staging", "pc13": "dev"}  # unique on a shared host


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("promo")
    nodes = [
        Node(root, name, "--profile", "local", "--token", TOKEN, "--labels", f"env={env}")
        for name, env in NAMES.items()
    ]
    owner = nodes[0]
    bind = tomllib.loads((owner.data / "kovanex.toml").read_text())["gossip"]["bind"]
    try:
        owner.start()
        for n in nodes[1:]:
            n.start("--join", bind)
        wait_for(lambda: len(_members(owner)) == 3, 30, "three members")
        tokens = {who: _token(owner, who) for who in ("alice", "bob")}
        yield {"root": root, "owner": owner, "nodes": nodes, "tokens": tokens}
    finally:
        for n in nodes:
            n.stop()


def _members(node: Node) -> list[dict[str, Any]]:
    return [
        m
        for m in json.loads(node.kx("members", "--format", "json").stdout)
        if m["status"] == "alive"
    ]


def _token(node: Node, name: str) -> str:
    return node.kx("token", "create", name, "--scope", "push").stdout.strip().splitlines()[-1]


def _url(node: Node, repo: str, token: str) -> str:
    bind = tomllib.loads((node.data / "kovanex.toml").read_text())["http"]["bind"]
    return f"http://user:{token}@{bind}/git/{repo}.git"


def setup_repo(c: dict[str, Any], repo: str, envs: str, files: dict[str, str]) -> Path:
    """A repo on the owner with environments.toml on main, pushed by alice over HTTP."""
    owner = c["owner"]
    owner.kx("repo", "create", repo)
    clone = c["root"] / f"clone-{repo}"
    git("clone", "-q", _url(owner, repo, c["tokens"]["alice"]), str(clone))
    git("checkout", "-q", "-b", "main", cwd=clone)
    (clone / ".kovanex").mkdir()
    (clone / ".kovanex" / "environments.toml").write_text(envs)
    for name, text in files.items():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        (clone / name).write_text(text)
    git("add", "-A", cwd=clone)
    git("commit", "-qm", "environments", cwd=clone)
    git("push", "-q", "origin", "main", cwd=clone)
    return clone


def push(clone: Path, *refspecs: str) -> subprocess.CompletedProcess[str]:
    return git("push", "origin", *refspecs, cwd=clone, check=False)


def envs(c: dict[str, Any], repo: str) -> dict[str, dict[str, Any]]:
    out = c["owner"].kx("env", "list", "--repo", repo, "--format", "json").stdout
    return {e["name"]: e for e in json.loads(out)}


def held(c: dict[str, Any], repo: str, env: str) -> str | None:
    rel = envs(c, repo)[env]["release"]
    return rel["version"] if rel else None


def settled(c: dict[str, Any], repo: str) -> bool:
    return all(not e["waiting"] for e in envs(c, repo).values())


def log_of(c: dict[str, Any], repo: str, ref: str) -> list[dict[str, str]]:
    return trailers_of(c["owner"].repo(repo), ref)


BASIC = dev_staging_prod("test -f app.txt", "grep -q hello app.txt", self_approval=False)
SCAN = '[[steps]]\nname = "scan"\nrun = "! grep -q SECRET app.txt"\n'


def test_a_release_walks_dev_staging_prod_with_an_approval(cluster: dict[str, Any]) -> None:
    c = cluster
    clone = setup_repo(c, "shop", BASIC, {"app.txt": "hello\n", ".kovanex/gates/scan.toml": SCAN})
    git("tag", "v1", cwd=clone)
    p = push(clone, "v1")
    assert p.returncode == 0, p.stderr
    report = p.stderr
    for line in ("promote v1 from push → dev", "promote v1 from dev → staging",
                 "✓ unit_tests passed", "✓ security_scan passed", "→ deployed to staging"):  # fmt: skip
        assert line in report, report
    assert report.index("→ deployed to dev") < report.index("→ deployed to staging")
    e = envs(c, "shop")
    assert e["staging"]["release"]["verified"] and e["staging"]["nodes"] == ["pb13"]
    assert held(c, "shop", "prod") is None  # prod is the last stop: not automatic
    # the tag's pusher (a token name, from the reflog) requested it, hop after hop
    assert log_of(c, "shop", "env/staging")[0]["Kovanex-Requested-By"] == "alice"
    # each gate ran as a task of its own on the node of its environment
    gate = next(t for t in log_of(c, "shop", "env/staging")[0].values() if "security_scan" in t)
    tid = gate.split("task=")[1].split()[0]
    nodes = {t.get("Kovanex-Node") for t in log_of(c, "shop", f"task/{tid}")} - {None}
    assert nodes == {"pb13"}

    owner = c["owner"]
    alice, bob = c["tokens"]["alice"], c["tokens"]["bob"]
    owner.kx("promote", "v1", "--to", "prod", "--repo", "shop", "--token", alice, "--no-wait")
    wait_for(
        lambda: [w["status"] for w in envs(c, "shop")["prod"]["waiting"]] == ["waiting"],
        60,
        "approval wait",
    )
    (w,) = envs(c, "shop")["prod"]["waiting"]
    assert w["id"] == "prod/v1" and w["needs"] == 1 and w["approvals"] == []
    r = owner.kx("approve", "prod/v1", "--repo", "shop", "--token", alice, check=False)
    assert r.returncode == 1 and "self-approval is off" in r.stderr
    owner.kx("approve", "prod/v1", "--repo", "shop", "--token", bob)
    wait_for(lambda: held(c, "shop", "prod") == "v1", 30, "v1 in prod")
    top = log_of(c, "shop", "env/prod")[0]
    assert top["Kovanex-Version"] == "v1" and top["Kovanex-Approved-By"] == "bob"
    assert top["Kovanex-Requested-By"] == "alice"
    assert top["Kovanex-Gate"].startswith("integration passed task=gate-prod-v1-integration")
    assert (
        "def=" in top["Kovanex-Gate"]
        and top["Kovanex-Source"] == git("rev-parse", "v1^{commit}", cwd=clone).stdout.strip()
    )
    approvals = [t for t in log_of(c, "shop", "promotion/prod/v1") if "Kovanex-Approved-By" in t]
    assert [t["Kovanex-Approved-By"] for t in approvals] == ["bob"]


def test_a_direct_push_to_env_prod_is_refused(cluster: dict[str, Any]) -> None:
    c = cluster
    clone = setup_repo(c, "locked", BASIC, {"app.txt": "hello\n", ".kovanex/gates/scan.toml": SCAN})
    p = push(clone, "HEAD:env/prod")
    assert p.returncode != 0
    assert "environments are not pushed to; promote a release instead" in p.stderr
    assert "kovanex promote <version> --to prod" in p.stderr
    assert git("ls-remote", "origin", "env/prod", cwd=clone).stdout == ""
    # a tag that is not a release (the pattern is v*) is just a tag: no promotion, no wait
    git("tag", "docs-1", cwd=clone)
    p = push(clone, "docs-1")
    assert p.returncode == 0 and "still running" not in p.stderr and "promote" not in p.stderr
    assert git("ls-remote", "origin", "refs/heads/promotion/*", cwd=clone).stdout == ""
    # a bad environments.toml on the default branch is refused with its field path
    envs_file = clone / ".kovanex" / "environments.toml"
    envs_file.write_text(BASIC.replace('from = "staging"', 'from = "stagin"'))
    git("commit", "-qam", "typo", cwd=clone)
    p = push(clone, "main")
    assert p.returncode != 0
    assert "environments[2].from: no environment 'stagin' is declared" in p.stderr, p.stderr


def test_a_failing_gate_stops_the_release(cluster: dict[str, Any]) -> None:
    c = cluster
    clone = setup_repo(
        c, "broken", BASIC, {"app.txt": "hello SECRET\n", ".kovanex/gates/scan.toml": SCAN}
    )
    git("tag", "v1", cwd=clone)
    p = push(clone, "v1")
    assert p.returncode == 0  # the tag is safe in git; the promotion is what failed
    assert "✗ security_scan failed" in p.stderr, p.stderr
    assert "✗ promotion stopped: gate security_scan failed" in p.stderr
    assert held(c, "broken", "dev") == "v1" and held(c, "broken", "staging") is None
    assert git("ls-remote", "origin", "env/staging", cwd=clone).stdout == ""


RACE = environments_toml(
    environment("dev", gates=[gate("slow", "sleep 1; test -f app.txt")]),
    environment("staging", "dev", auto=True),
)


def test_two_racing_promotions_are_queued_never_interleaved(cluster: dict[str, Any]) -> None:
    c = cluster
    clone = setup_repo(c, "race", RACE, {"app.txt": "1\n"})
    git("tag", "v1", cwd=clone)
    (clone / "app.txt").write_text("2\n")
    git("commit", "-qam", "two", cwd=clone)
    git("tag", "v2", cwd=clone)
    env = {"GIT_TERMINAL_PROMPT": "0"}
    procs = [
        subprocess.Popen(
            ["git", "push", "-q", "origin", v],
            cwd=clone,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for v in ("v1", "v2")
    ]
    for pr in procs:
        _, err = pr.communicate(timeout=120)
        assert pr.returncode == 0, err.decode(errors="replace")

    def over() -> dict[str, Any] | None:
        """One `env list` (one snapshot of the owner's refs, where three calls would be
        three): both releases' dev promotions exist, none is live in either environment,
        and staging holds what dev holds."""
        out = git("for-each-ref", "--format=%(refname)", "refs/heads/promotion/dev/", cwd=repo)
        if {r.rsplit("/", 1)[1] for r in out.stdout.split()} != {"v1", "v2"}:
            return None
        e = envs(c, "race")
        dev, staging = e["dev"], e["staging"]
        if dev["waiting"] or staging["waiting"] or None in (dev["release"], staging["release"]):
            return None
        return e if dev["release"]["version"] == staging["release"]["version"] else None

    repo = c["owner"].repo("race")
    winner = wait_for(over, 90, "race settled")["dev"]["release"]["version"]
    loser = {"v1": "v2", "v2": "v1"}[winner]
    for env_name in ("dev", "staging"):
        hist = log_of(c, "race", f"env/{env_name}")
        assert hist[0]["Kovanex-Version"] == winner
        borns = [float(t["Kovanex-Born"]) for t in reversed(hist)]
        assert borns == sorted(borns)  # never an older release over a newer one
        parents = git("log", "--format=%P", f"env/{env_name}", cwd=c["owner"].repo("race"))
        assert all(len(p.split()) <= 1 for p in parents.stdout.split("\n"))  # a line
    dev = [t["Kovanex-Version"] for t in log_of(c, "race", "env/dev")]
    if loser not in dev:  # the older release lost the race: that is recorded on it
        sup = [
            t for t in log_of(c, "race", f"promotion/dev/{loser}") if "Kovanex-Superseded-By" in t
        ]
        assert sup and sup[0]["Kovanex-Superseded-By"] == winner


ROLLBACK = environments_toml(
    environment("dev", rollback="auto", deploy={"run": "test ! -f broken"})
)


def test_a_failed_deploy_rolls_back_by_itself(cluster: dict[str, Any]) -> None:
    c = cluster
    clone = setup_repo(c, "rb", ROLLBACK, {"app.txt": "1\n"})
    git("tag", "v1", cwd=clone)
    assert "→ deployed to dev" in push(clone, "v1").stderr
    (clone / "broken").write_text("yes\n")
    git("add", "broken", cwd=clone)
    git("commit", "-qm", "broken", cwd=clone)
    git("tag", "v2", cwd=clone)
    p = push(clone, "v2")
    assert "✗ deploy of v2 to dev failed" in p.stderr, p.stderr
    wait_for(
        lambda: [t["Kovanex-Version"] for t in log_of(c, "rb", "env/dev")] == ["v1", "v2", "v1"],
        60,
        "rollback",
    )
    top = log_of(c, "rb", "env/dev")[0]
    assert top["Kovanex-Rollback-Of"] == "v2"
    wait_for(lambda: envs(c, "rb")["dev"]["release"]["verified"], 30, "the rollback re-deployed")
    # a promote/<version> ref starts a promotion too; `kovanex rollback` goes back by hand
    git("rm", "-q", "broken", cwd=clone)
    git("commit", "-qm", "fixed", cwd=clone)
    assert "→ deployed to dev" in push(clone, "HEAD:refs/heads/promote/v3").stderr
    assert held(c, "rb", "dev") == "v3"
    out = c["owner"].kx("rollback", "dev", "--repo", "rb").stdout
    assert "rolling back dev from v3 to v1" in out, out
    versions = [t["Kovanex-Version"] for t in log_of(c, "rb", "env/dev")]
    assert versions == ["v1", "v3", "v1", "v2", "v1"]  # newest first; nothing rewritten


def test_a_gate_definition_changed_after_a_pass_voids_its_verdict(cluster: dict[str, Any]) -> None:
    c = cluster
    clone = setup_repo(c, "defs", BASIC, {"app.txt": "hello\n", ".kovanex/gates/scan.toml": SCAN})
    git("tag", "v1", cwd=clone)
    assert "→ deployed to staging" in push(clone, "v1").stderr
    assert envs(c, "defs")["staging"]["release"]["verified"]
    (clone / ".kovanex" / "gates" / "scan.toml").write_text(SCAN.replace("SECRET", "PASSWORD"))
    git("commit", "-qam", "stricter scan", cwd=clone)
    assert push(clone, "main").returncode == 0
    wait_for(lambda: not envs(c, "defs")["staging"]["release"]["verified"], 20, "verdict voided")
    out = c["owner"].kx("promote", "v1", "--to", "staging", "--repo", "defs").stdout
    assert "✓ unit_tests passed (reused)" in out and "✓ security_scan passed" in out, out
    assert envs(c, "defs")["staging"]["release"]["verified"]
    hist = log_of(c, "defs", "env/staging")
    assert [t["Kovanex-Version"] for t in hist] == ["v1", "v1"]
    assert hist[0]["Kovanex-Gate"] != hist[1]["Kovanex-Gate"]  # a new def= for security_scan
    # a failed re-verification takes "verified" away (and moves nothing)
    (clone / ".kovanex" / "gates" / "scan.toml").write_text(SCAN.replace("SECRET", "hello"))
    git("commit", "-qam", "a scan that fails", cwd=clone)
    assert push(clone, "main").returncode == 0
    r = c["owner"].kx("verify", "staging", "--repo", "defs", check=False)
    assert r.returncode == 1 and "✗ re-verification failed: security_scan" in r.stdout, r.stdout
    assert envs(c, "defs")["staging"]["release"]["verified"] is False
    assert len(log_of(c, "defs", "env/staging")) == 2
