"""The one module that runs the git CLI (ADR 0017).

Why one: every copy had its own idea of the environment (a hook's GIT_DIR or
GIT_QUARANTINE_PATH leaking into a fetch of another repo), of timeouts (300 s for a
fetch from a dead peer) and of errors (a return code here, an exception there). Here:

- environment hygiene: repo pointers inherited from a hook are dropped, git never
  prompts, the system config is not read, and a token travels as env config (argv is
  world-readable in `ps`, a process's environment only by its user);
- every call has a timeout; `GitTimeout` when it passes;
- `GitError` carries the command (no secrets: they are in the env), the exit code and
  stderr's last line;
- `run_async` for network calls made from the event loop: cancelling the awaiting task
  kills the git process group, so no thread and no lock outlives a hung peer (ADR 0016).

pygit2 code (gitstate/pygit2store.py) stays in-process; this is for the CLI only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kovanex import proc
from kovanex.gitstate.refs import HIDDEN

if TYPE_CHECKING:  # the CLI reads git through `run` and should not load the event loop
    import asyncio

ZERO = "0" * 40

# Timeouts, gathered here (seconds). LOCAL: a command on a local repo. NETWORK: a
# fetch/push/ls-remote a client or runner waits for. REPLICA_FETCH: a replica's fetch from
# its owner, short because a replica must notice a new owner quickly (ADR 0016); the first
# copy of a repo moves every object and gets REPLICA_CLONE.
LOCAL_TIMEOUT_S = 60.0
CHECKOUT_TIMEOUT_S = 600.0  # worktree add / add -A on a big tree
NETWORK_TIMEOUT_S = 300.0
REPLICA_FETCH_TIMEOUT_S = 15.0  # with progress: no byte for this long (ADR 0068)
REPLICA_CLONE_TIMEOUT_S = 120.0
TRANSFER_CAP_S = 1800.0  # a transfer that keeps moving still ends after this (ADR 0068)
# What packs we serve are made with: an object above this is streamed, never delta'd nor
# read whole into memory, so its bytes start flowing at once (a 300 MB blob held a
# pack-objects at 1.2 GiB RSS, silent for as long as it deflated: issue 24).
PACK_CONFIG = (("core.bigFileThreshold", "16m"),)
SYNC_PUSH_TIMEOUT_S = 5.0
KILL_GRACE_S = 1.0  # SIGTERM (git removes its lock files), then SIGKILL

# What a hook or a caller's shell may have set that points git at another repo or
# changes what it does; never inherited.
DROP_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_QUARANTINE_PATH",
    "GIT_NAMESPACE",
    "GIT_COMMON_DIR",
    "GIT_PREFIX",
    "GIT_CEILING_DIRECTORIES",
    "GIT_REFLOG_ACTION",
    "GIT_EXEC_PATH",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_PROTOCOL",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
)
_DROP_PREFIXES = ("GIT_PUSH_OPTION_",)


class GitError(Exception):
    """git exited non-zero: `args` (the git arguments), `returncode`, `stderr`."""

    def __init__(self, args: Iterable[str], returncode: int, stderr: str) -> None:
        self.git_args = list(args)
        self.returncode = returncode
        self.stderr = stderr
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        self.last_line = lines[-1] if lines else ""
        super().__init__(f"git {' '.join(self.git_args)}: exit {returncode}: {self.last_line}")


class GitTimeout(GitError):
    """git did not finish within its timeout and was killed."""

    def __init__(self, args: Iterable[str], timeout: float, why: str = "") -> None:
        super().__init__(args, 124, why or f"timed out after {timeout}s")
        self.timeout = timeout


@dataclass(frozen=True)
class Result:
    """A finished git command (any exit code)."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def check(self) -> Result:
        if self.returncode != 0:
            raise GitError(self.args, self.returncode, self.stderr)
        return self


def env(token: str | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our environment minus repo pointers, never prompting, no system config, with the
    token as `http.extraHeader` env config; `extra` last (e.g. a quarantine's object dir)."""
    out = {
        k: v
        for k, v in os.environ.items()
        if k not in DROP_ENV and not k.startswith(_DROP_PREFIXES)
    }
    out["GIT_TERMINAL_PROMPT"] = "0"
    out["GIT_ASKPASS"] = "true"  # never ask a human; fail on 401 instead
    out["GIT_CONFIG_NOSYSTEM"] = "1"
    if token:
        n = int(out.get("GIT_CONFIG_COUNT", "0") or 0)
        out[f"GIT_CONFIG_KEY_{n}"] = "http.extraHeader"
        out[f"GIT_CONFIG_VALUE_{n}"] = f"Authorization: Bearer {token}"
        out["GIT_CONFIG_COUNT"] = str(n + 1)
    out.update(extra or {})
    return out


def _argv(
    args: Iterable[str | os.PathLike[str]],
    git_dir: Path | str | None,
    config: Iterable[tuple[str, str]] = (),
) -> list[str]:
    pre = [x for k, v in config for x in ("-c", f"{k}={v}")]
    if git_dir is not None:  # absolute: git runs in `/` unless told otherwise
        pre += ["--git-dir", os.path.abspath(git_dir)]
    return [*pre, *map(str, args)]


def command(
    args: Iterable[str | os.PathLike[str]],
    *,
    git_dir: Path | str | None = None,
    config: Iterable[tuple[str, str]] = (),
) -> list[str]:
    """The full argv (`git ...`) for callers that build pipelines with Popen themselves;
    pair it with `env()`."""
    return ["git", *_argv(args, git_dir, config)]


def run(
    args: Iterable[str | os.PathLike[str]],
    *,
    git_dir: Path | str | None = None,
    input: str | None = None,
    timeout: float = LOCAL_TIMEOUT_S,
    token: str | None = None,
    env_extra: Mapping[str, str] | None = None,
    check: bool = True,
    cwd: Path | str | None = None,
    config: Iterable[tuple[str, str]] = (),
) -> Result:
    """Run `git [-c k=v]... [--git-dir D] args...` (blocking) in `cwd` (default `/`, so
    no repo is found by accident). Raises GitTimeout on timeout and, with `check`,
    GitError on a non-zero exit."""
    argv = _argv(args, git_dir, config)
    try:
        p = proc.run(
            ["git", *argv],
            env=env(token, env_extra),
            input=input.encode() if input is not None else None,
            timeout=timeout,
            cwd=str(cwd) if cwd is not None else "/",
        )
    except proc.ProcTimeout:
        raise GitTimeout(argv, timeout) from None
    res = Result(argv, p.returncode, p.text("stdout"), p.text("stderr"))
    return res.check() if check else res


async def run_async(
    args: Iterable[str],
    *,
    git_dir: Path | str | None = None,
    input: str | None = None,
    timeout: float = NETWORK_TIMEOUT_S,
    token: str | None = None,
    env_extra: Mapping[str, str] | None = None,
    check: bool = True,
    idle: float | None = None,
) -> Result:
    """`run` for the event loop: no thread, and cancelling the caller (or the timeout)
    terminates git's whole process group (git-remote-http included) before returning.
    `idle`: the deadline grows with progress (ADR 0068): git is ended when it wrote
    nothing (stdout or stderr: pass `--progress`) for `idle` seconds, and `timeout` is
    then the cap on the whole call."""
    import asyncio

    from kovanex.gitstate.progress import Progress, Stalled, guard

    argv = _argv(args, git_dir)
    child = await proc.spawn(
        ["git", *argv],
        env=env(token, env_extra),
        stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
    )
    data = input.encode() if input is not None else None
    progress = Progress(idle, timeout) if idle is not None else None
    out, err = bytearray(), bytearray()

    async def pump(stream: asyncio.StreamReader, buf: bytearray) -> None:
        while chunk := await stream.read(64 * 1024):
            buf += chunk
            if progress is not None:
                progress.mark(len(chunk))

    async def feed() -> None:
        if data is None or child.stdin is None:
            return
        try:
            child.stdin.write(data)
            await child.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # git stopped reading: its exit code says why
        child.stdin.close()

    async def talk() -> None:
        assert child.stdout is not None and child.stderr is not None
        await asyncio.gather(feed(), pump(child.stdout, out), pump(child.stderr, err))
        await child.wait()

    try:
        if progress is None:
            await asyncio.wait_for(talk(), timeout)
        else:
            await guard(talk(), progress)
    except Stalled as e:
        await proc.terminate(child, KILL_GRACE_S)
        raise GitTimeout(argv, timeout, str(e)) from None
    except TimeoutError:
        await proc.terminate(child, KILL_GRACE_S)
        raise GitTimeout(argv, timeout) from None
    except asyncio.CancelledError:
        await proc.terminate(child, KILL_GRACE_S)
        raise
    res = Result(
        argv, child.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
    )
    return res.check() if check else res


# -- helpers on a local repo -----------------------------------------------------------
def for_each_ref(git_dir: Path | str, prefix: str = "refs/") -> dict[str, str]:
    """ref -> oid for every ref under `prefix`."""
    out = run(["for-each-ref", "--format=%(objectname) %(refname)", prefix], git_dir=git_dir)
    refs = {}
    for line in out.stdout.splitlines():
        oid, _, name = line.partition(" ")
        if name:
            refs[name] = oid
    return refs


def is_ancestor(git_dir: Path | str, old: str, new: str) -> bool:
    """Whether `new` descends from (or is) `old`."""
    r = run(["merge-base", "--is-ancestor", old, new], git_dir=git_dir, check=False)
    return r.returncode == 0


def update_ref_cas(
    git_dir: Path | str, moves: Iterable[tuple[str, str | None, str | None]]
) -> bool:
    """All of `moves` (ref, new, expected old; new=None deletes, old=None: must not exist)
    as one atomic `update-ref --stdin` transaction; False if any expectation failed."""
    lines = []
    for ref, new, old in moves:
        if new is None:
            lines.append(f"delete {ref} {old or ''}".rstrip() + "\n")
        else:
            lines.append(f"update {ref} {new} {old or ZERO}\n")
    if not lines:
        return True
    return run(["update-ref", "--stdin"], git_dir=git_dir, input="".join(lines), check=False).ok


def rev_parse(git_dir: Path | str, rev: str) -> str | None:
    r = run(["rev-parse", "--verify", "-q", rev], git_dir=git_dir, check=False)
    return r.stdout.strip() or None if r.ok else None


# Archived task refs are hidden from a client's push and fetch advertisement, so a push
# to a repo with 10,000 finished tasks advertises what a fresh repo does (refs.HIDDEN).
HIDE_CONFIG = tuple(
    (key, prefix) for prefix in HIDDEN for key in ("receive.hideRefs", "uploadpack.hideRefs")
)
# No reflog is made unless one exists (ADR 0040): a reflog per task branch cost every ref
# write an append and grew with history. A release ref's pusher is still logged: the
# pre-receive check starts its reflog (pushcheck.keep_pusher_log), and git appends to it.
NO_REFLOGS = ("core.logAllRefUpdates", "false")
# The agent schedules `git maintenance` per repo (ADR 0031), so gc --auto is a no-op
# (gc.auto 0); receive-pack would still start it after every push (~3 ms): not at all.
NO_AUTOGC = ("receive.autogc", "false")
# Config every bare repo Kovanex serves gets: push options reach the hooks, objects are
# checked on receive, and no gc racing the agent.
BARE_CONFIG = (
    ("receive.advertisePushOptions", "true"),
    ("receive.fsckObjects", "true"),
    NO_REFLOGS,
    ("gc.auto", "0"),
    NO_AUTOGC,
    *HIDE_CONFIG,
)


def ensure_repo_config(path: Path | str, pack_bytes: int | None = None) -> bool:
    """Give a repo made before archiving existed its hideRefs lines, one made before
    ADR 0040 no reflogs for new refs, and one made before it no gc started per push (agent
    start); with `pack_bytes`, git's own bound on a push's pack (receive.maxInputSize,
    `limits.pack_bytes`: refused before any hook runs). True if it lacked any. One
    `git config` read when nothing is missing."""
    pattern = r"\.hiderefs$|^core\.logallrefupdates$|^receive\.autogc$|^receive\.maxinputsize$"
    have = run(["config", "--get-regexp", pattern], git_dir=path, check=False).stdout
    lines = set(have.splitlines())
    if pack_bytes is not None and f"receive.maxinputsize {pack_bytes}" not in lines:
        run(["config", "receive.maxInputSize", str(pack_bytes)], git_dir=path)
    missing = [(k, v) for k, v in HIDE_CONFIG if f"{k.lower()} {v}" not in lines]
    for key, val in missing:
        run(["config", "--add", key, val], git_dir=path)
    if f"{NO_AUTOGC[0].lower()} {NO_AUTOGC[1]}" not in lines:
        run(["config", *NO_AUTOGC], git_dir=path)
        missing.append(NO_AUTOGC)
    if any(
        ln.startswith("core.logallrefupdates ") for ln in lines - {"core.logallrefupdates false"}
    ):
        run(["config", *NO_REFLOGS], git_dir=path)
        return True
    return bool(missing)


def create_bare(
    path: Path,
    *,
    config: Iterable[tuple[str, str]] = BARE_CONFIG,
    atomic: bool = True,
) -> Path:
    """Create a bare repo at `path` with `config`. `atomic`: build it beside the target and
    rename, so a repo appears complete or not at all (the agent globs `*.git`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp") if atomic else path
    if atomic and tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    run(["init", "-q", "--bare", str(tmp)])
    for key, val in config:
        run(["config", key, val], git_dir=tmp)
    if atomic:
        tmp.rename(path)
    return path
