"""Ref mirroring between nodes with the git CLI: fetch into staging, then CAS each ref.

Why staging (Radicle's model, docs/ARCHITECTURE.md section 5): `git fetch` verifies the pack and
its connectivity before any ref we act on moves; then every real ref moves with a
compare-and-swap against the value we saw, so a concurrent local write (a claim, a step
commit) is never overwritten, and a non-fast-forward is refused unless asked for.

The two halves are separate functions because they differ in kind (ADR 0016): the fetch is
network I/O and may hang on a dead peer, so callers run it holding no lock; applying the
staged refs is local, quick, and is where a caller re-checks that the peer it fetched from
is still the one to follow. `fetch` does both, for callers with nothing to re-check.

All git runs through `kovanex.gitstate.gitcli` (env hygiene, timeouts, the token in env).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kovanex.gitstate import gitcli
from kovanex.gitstate.gitcli import ZERO, GitError
from kovanex.gitstate.refs import STAGING, STAGING_REFS, SYNC_STAGING

TIMEOUT_S = gitcli.NETWORK_TIMEOUT_S
MirrorError = GitError  # git failed (network, auth, a missing remote ref); kept for callers

__all__ = [
    "STAGING",
    "SYNC_STAGING",
    "ZERO",
    "MirrorError",
    "Fetched",
    "PushResult",
    "git_env",
    "fetch",
    "fetch_args",
    "fetch_to_staging",
    "apply_staged",
    "push_lease",
    "ls_remote",
    "ls_remote_args",
    "parse_ls_remote",
]


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
    """The environment gitcli gives git (kept for callers and tests)."""
    return gitcli.env(token)


def _for_each_ref(repo: Path, prefix: str) -> dict[str, str]:
    return gitcli.for_each_ref(repo, prefix)


def _is_ancestor(repo: Path, old: str, new: str) -> bool:
    return gitcli.is_ancestor(repo, old, new)


def _check_ref(ref: str) -> None:
    if not ref.startswith("refs/") or ref.startswith(STAGING) or ":" in ref or ref.startswith("^"):
        raise ValueError(f"not a ref we mirror: {ref!r}")


def fetch_args(
    local_repo: Path, url: str, refs: list[str] | None, *, progress: bool = False
) -> list[str]:
    """The git arguments that fetch `refs` (None: every ref but the remote's staging) from
    `url` into `local_repo`'s staging refs; `[]` when there is nothing to fetch.
    `progress`: git reports on stderr as bytes arrive (for a deadline that grows with
    them, `gitcli.run_async(idle=...)`), instead of `--quiet`."""
    if refs is not None:
        for r in refs:
            _check_ref(r)
        if not refs:
            return []
        opts, specs = [], [f"+{r}:{STAGING}{r}" for r in refs]
    else:
        # --prune keeps staging equal to the remote, so a ref deleted there is not revived
        opts, specs = ["--prune"], [f"+refs/*:{STAGING_REFS}*", f"^{STAGING}*"]
    return [
        "--git-dir", str(local_repo),
        "-c", "transfer.fsckObjects=true",
        "fetch", "--progress" if progress else "--quiet", "--no-tags", "--no-write-fetch-head", "--no-auto-gc",
        "--no-recurse-submodules", *opts, url, *specs,
    ]  # fmt: skip


def fetch_to_staging(
    local_repo: Path,
    url: str,
    refs: list[str] | None = None,
    *,
    token: str | None,
    timeout: float = TIMEOUT_S,
) -> None:
    """The network half: objects and staging refs only; no real ref moves."""
    args = fetch_args(local_repo, url, refs)
    if args:
        gitcli.run(args, token=token, timeout=timeout)


def apply_staged(
    local_repo: Path, refs: list[str] | None = None, *, force: bool = False
) -> Fetched:
    """The local half: move each real ref (of `refs`, None: all staged) from the value we
    read to the staged one, if a fast-forward (or `force`); a ref that moved under us
    meanwhile is left alone and reported in `.refused`. Remote deletions are not mirrored."""
    staged = {
        name[len(STAGING) :]: oid
        for name, oid in _for_each_ref(local_repo, STAGING_REFS).items()
        if refs is None or name[len(STAGING) :] in refs
    }
    local = _for_each_ref(local_repo, "refs/")
    result = Fetched()
    moves: list[tuple[str, str | None, str | None]] = []
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
    if gitcli.update_ref_cas(local_repo, moves):  # the common case: one atomic transaction
        result.update({ref: str(new) for ref, new, _ in moves})
        return result
    for move in moves:  # someone moved a ref under us: apply the others one by one
        ref, new, old = move
        if gitcli.update_ref_cas(local_repo, [move]):
            result[ref] = str(new)
        else:
            result.refused[ref] = f"changed locally while fetching (expected {old or 'absent'})"
    return result


def fetch(
    local_repo: Path,
    url: str,
    refs: list[str] | None = None,
    *,
    token: str | None,
    force: bool = False,
    timeout: float = TIMEOUT_S,
) -> Fetched:
    """Mirror `refs` (None: every ref but the remote's staging) from `url` into `local_repo`.

    Objects land first under `refs/kovanex/staging/<ref>`, which also records what the remote
    held when we last looked; then `apply_staged`.
    """
    if refs is not None and not refs:
        return Fetched()
    fetch_to_staging(local_repo, url, refs, token=token, timeout=timeout)
    return apply_staged(local_repo, refs, force=force)


def push_lease(
    local_repo: Path,
    url: str,
    ref: str,
    new: str,
    expected_old: str | None,
    *,
    token: str | None,
    push_options: tuple[str, ...] | list[str] = (),
    timeout: float = TIMEOUT_S,
) -> PushResult:
    """Push `new` to `ref` at `url` only if the remote still holds `expected_old` (None: the
    ref must not exist). `message` carries the remote's words (hook output, e.g. a
    pre-receive refusal) followed by git's one-line summary for the ref."""
    _check_ref(ref)
    lease = f"--force-with-lease={ref}:{expected_old or ''}"
    args = ["push", "--porcelain", "--no-verify", lease]
    for opt in push_options:
        args += ["-o", opt]
    try:
        proc = gitcli.run(
            [*args, url, f"{new}:{ref}"],
            git_dir=local_repo,
            token=token,
            timeout=timeout,
            check=False,
        )
    except gitcli.GitTimeout as e:
        return PushResult(False, str(e))
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


def ls_remote_args(url: str) -> list[str]:
    return ["ls-remote", url]


def parse_ls_remote(stdout: str) -> dict[str, str]:
    """The remote's refs (peeled `^{}` entries left out)."""
    refs = {}
    for line in stdout.splitlines():
        oid, _, name = line.partition("\t")
        if name and not name.endswith("^{}"):
            refs[name] = oid
    return refs


def ls_remote(url: str, token: str | None, *, timeout: float = TIMEOUT_S) -> dict[str, str]:
    """The remote's refs (peeled `^{}` entries left out)."""
    out = gitcli.run(ls_remote_args(url), token=token, timeout=timeout)
    return parse_ls_remote(out.stdout)
