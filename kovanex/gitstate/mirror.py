"""Ref mirroring between nodes with the git CLI: fetch into staging, then CAS each ref.

Why staging (Radicle's model, docs/ARCHITECTURE.md section 5): `git fetch` verifies the pack and
its connectivity before any ref we act on moves; then every real ref moves with a
compare-and-swap against the value we saw, so a concurrent local write (a claim, a step
commit) is never overwritten, and a non-fast-forward is refused unless asked for.

The cluster token travels in `GIT_CONFIG_COUNT` environment config as an
`Authorization: Bearer` header: argv is world-readable in `ps`, a process's environment is
readable only by its user.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

STAGING = "refs/kovanex/staging/"
# Where a `sync` owner pushes quarantined objects before it acknowledges a write. Not under
# `STAGING + "refs/"`, so a full fetch's --prune (which keeps that subtree equal to the
# remote) never removes an acknowledged commit a replica holds only there.
SYNC_STAGING = STAGING + "sync/"
ZERO = "0" * 40
TIMEOUT_S = 300.0
_DROP_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_NAMESPACE")


class MirrorError(Exception):
    """git failed (network, auth, a missing remote ref): stderr says why."""


class Fetched(dict[str, str]):
    """Refs that moved (ref -> new oid); `refused` says which did not and why."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: dict[str, str] = {}


@dataclass(frozen=True)
class PushResult:
    ok: bool
    message: str


def git_env(token: str | None) -> dict[str, str]:
    """Our environment minus repo pointers, never prompting, with the token as env config."""
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_ASKPASS"] = "true"  # never ask a human; fail on 401 instead
    env.pop("SSH_ASKPASS", None)
    if token:
        n = int(env.get("GIT_CONFIG_COUNT", "0") or 0)
        env[f"GIT_CONFIG_KEY_{n}"] = "http.extraHeader"
        env[f"GIT_CONFIG_VALUE_{n}"] = f"Authorization: Bearer {token}"
        env["GIT_CONFIG_COUNT"] = str(n + 1)
    return env


def _git(
    args: list[str],
    *,
    token: str | None = None,
    input: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["git", *args],
        env=git_env(token),
        input=input,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd="/",
    )
    if check and proc.returncode != 0:
        # argv carries no secret (the token is in env), so it may go into the message
        raise MirrorError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _for_each_ref(repo: Path, prefix: str) -> dict[str, str]:
    out = _git(
        ["--git-dir", str(repo), "for-each-ref", "--format=%(objectname) %(refname)", prefix]
    )
    refs = {}
    for line in out.stdout.splitlines():
        oid, _, name = line.partition(" ")
        refs[name] = oid
    return refs


def _is_ancestor(repo: Path, old: str, new: str) -> bool:
    r = _git(["--git-dir", str(repo), "merge-base", "--is-ancestor", old, new], check=False)
    return r.returncode == 0


def _check_ref(ref: str) -> None:
    if not ref.startswith("refs/") or ref.startswith(STAGING) or ":" in ref or ref.startswith("^"):
        raise ValueError(f"not a ref we mirror: {ref!r}")


def fetch(
    local_repo: Path,
    url: str,
    refs: list[str] | None = None,
    *,
    token: str | None,
    force: bool = False,
) -> Fetched:
    """Mirror `refs` (None: every ref but the remote's staging) from `url` into `local_repo`.

    Objects land first under `refs/kovanex/staging/<ref>`, which also records what the remote
    held when we last looked. Then each ref moves from the value we read to the staged one,
    only if it is a fast-forward (or `force`); a ref that moved under us meanwhile is left
    alone and reported in `.refused`. Remote deletions are not mirrored.
    """
    if refs is not None:
        for r in refs:
            _check_ref(r)
        if not refs:
            return Fetched()
        opts, specs = [], [f"+{r}:{STAGING}{r}" for r in refs]
    else:
        # --prune keeps staging equal to the remote, so a ref deleted there is not revived
        opts, specs = ["--prune"], [f"+refs/*:{STAGING}refs/*", f"^{STAGING}*"]
    _git(
        [
            "--git-dir", str(local_repo),
            "-c", "transfer.fsckObjects=true",
            "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-auto-gc",
            "--no-recurse-submodules", *opts, url, *specs,
        ],
        token=token,
    )  # fmt: skip
    staged = {
        name[len(STAGING) :]: oid
        for name, oid in _for_each_ref(local_repo, STAGING + "refs/").items()
        if refs is None or name[len(STAGING) :] in refs
    }
    local = _for_each_ref(local_repo, "refs/")
    result = Fetched()
    moves: list[tuple[str, str, str | None]] = []
    for ref, new in sorted(staged.items()):
        old = local.get(ref)
        if old == new:
            continue
        if old is not None and not force and not _is_ancestor(local_repo, old, new):
            result.refused[ref] = f"non-fast-forward: local {old}, remote {new}"
            continue
        moves.append((ref, new, old))
    if not moves:
        return result
    if _update_refs(local_repo, moves):  # the common case: one atomic transaction
        result.update({ref: new for ref, new, _ in moves})
        return result
    for move in moves:  # someone moved a ref under us: apply the others one by one
        ref, new, old = move
        if _update_refs(local_repo, [move]):
            result[ref] = new
        else:
            result.refused[ref] = f"changed locally while fetching (expected {old or 'absent'})"
    return result


def _update_refs(repo: Path, moves: list[tuple[str, str, str | None]]) -> bool:
    """All of `moves` as one CAS transaction (`update-ref --stdin` is atomic)."""
    lines = "".join(f"update {ref} {new} {old or ZERO}\n" for ref, new, old in moves)
    r = _git(["--git-dir", str(repo), "update-ref", "--stdin"], input=lines, check=False)
    return r.returncode == 0


def push_lease(
    local_repo: Path,
    url: str,
    ref: str,
    new: str,
    expected_old: str | None,
    *,
    token: str | None,
    push_options: tuple[str, ...] | list[str] = (),
) -> PushResult:
    """Push `new` to `ref` at `url` only if the remote still holds `expected_old` (None: the
    ref must not exist). `message` carries the remote's words (hook output, e.g. a
    pre-receive refusal) followed by git's one-line summary for the ref."""
    _check_ref(ref)
    lease = f"--force-with-lease={ref}:{expected_old or ''}"
    args = ["--git-dir", str(local_repo), "push", "--porcelain", "--no-verify", lease]
    for opt in push_options:
        args += ["-o", opt]
    proc = _git([*args, url, f"{new}:{ref}"], token=token, check=False)
    status = _porcelain_status(proc.stdout, ref)
    remote = [
        line.removeprefix("remote:").strip()
        for line in proc.stderr.splitlines()
        if line.startswith("remote:") and line.removeprefix("remote:").strip()
    ]
    ok = status is not None and status[0] in " +*=" and proc.returncode == 0
    detail = status[1] if status is not None else proc.stderr.strip()
    return PushResult(ok, "\n".join([*remote, detail]).strip() or "push failed")


def _porcelain_status(stdout: str, ref: str) -> tuple[str, str] | None:
    """(flag, summary) for `ref` from `git push --porcelain` output."""
    for line in stdout.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[1].endswith(f":{ref}"):
            return parts[0][:1], parts[2]
    return None


def ls_remote(url: str, token: str | None) -> dict[str, str]:
    """The remote's refs (peeled `^{}` entries left out)."""
    out = _git(["ls-remote", url], token=token)
    refs = {}
    for line in out.stdout.splitlines():
        oid, _, name = line.partition("\t")
        if name and not name.endswith("^{}"):
            refs[name] = oid
    return refs
