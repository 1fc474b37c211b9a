"""What one push may carry, measured from object headers before anything reads an object.

A 20 MB commit message cost the node 9.4 s of event loop, because every later reader
(pre-receive, the ledger, the scheduler) decoded and split it (issue 24). Here the
quarantine directory of the push (the objects it brought, nothing else) is listed with
`git cat-file --batch-all-objects --batch-check`: git reads each object's header only, so
a 50 MB blob costs no more than a 5-byte one. Commits over `limits.message_bytes`, more
commits than `limits.push_commits` and any object over `limits.object_bytes` are refused
with the limit named. The whole pack is bounded earlier by git itself
(receive.maxInputSize = `limits.pack_bytes`, set on every repo). Stdlib only: the hooks'
slow path runs this too.
"""

from __future__ import annotations

import os
import subprocess

from kovanex import proc
from kovanex.inputlimits import InputLimits, human

GIT_TIMEOUT_S = 60.0
CHUNK = 1 << 20
SHOW = 3  # name at most this many offending objects; the count says the rest


def pushed_objects(git_dir: str, quarantine: str) -> list[tuple[str, str, int]]:
    """(oid, type, size) of every object in the push's quarantine, headers only. Only the
    quarantine is listed: git's alternates variable (the repo's own objects) is dropped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_DIR=git_dir, GIT_OBJECT_DIRECTORY=quarantine)
    done = proc.run(
        [
            "git",
            "cat-file",
            "--batch-all-objects",
            "--unordered",
            "--batch-check=%(objectname) %(objecttype) %(objectsize)",
        ],  # fmt: skip
        env=env,
        cwd=git_dir,  # as the hook ran it: a relative quarantine path still resolves
        timeout=GIT_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise OSError(f"git cat-file exited {done.returncode}: {done.text('stderr').strip()}")
    objs = []
    for line in done.stdout.decode().splitlines():
        oid, kind, size = line.split(" ")
        objs.append((oid, kind, int(size)))
    return objs


def message_sizes(git_dir: str, quarantine: str, commits: list[tuple[str, int]]) -> list[int]:
    """Each commit's message size: its object size less its header. One `cat-file --batch`
    streams them; each header is read up to its blank line and the message is skipped in
    chunks, so a 20 MB message is never held to say how big it is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_DIR=git_dir, GIT_OBJECT_DIRECTORY=quarantine)
    sizes = []
    with subprocess.Popen(
        ["git", "cat-file", "--batch"], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    ) as proc:  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("".join(f"{oid}\n" for oid, _ in commits).encode())
        proc.stdin.close()
        for _oid, size in commits:
            proc.stdout.readline()  # "<oid> commit <size>"
            header = 0
            while header < size:
                line = proc.stdout.readline(CHUNK)
                header += len(line)
                if line == b"\n" or not line:
                    break
            left = size + 1 - header  # the message and the newline after the object
            while left > 0:
                got = len(proc.stdout.read(min(left, CHUNK)))
                if not got:
                    break
                left -= got
            sizes.append(max(size - header, 0))
    return sizes


def refusals(git_dir: str, quarantine: str, limits: InputLimits) -> list[str]:
    """Every limit this push breaks, one message each (empty: within all of them). A push
    that cannot be measured is refused: accepting it unmeasured is what the limits stop."""
    try:
        return _refusals(git_dir, quarantine, limits)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return [f"kovanex: the push's objects could not be measured ({e}); nothing was written"]


def _refusals(git_dir: str, quarantine: str, limits: InputLimits) -> list[str]:
    objs = pushed_objects(git_dir, quarantine)
    out: list[str] = []
    commits = [(oid, size) for oid, kind, size in objs if kind == "commit"]
    if len(commits) > limits.push_commits:
        out.append(
            f"kovanex: this push carries {len(commits)} commits; the limit is "
            f"{limits.push_commits} commits per push (limits.push_commits); push the "
            "history in parts (git push origin <older-commit>:<branch>, then the rest)"
        )
    long = [(oid, size) for oid, size in commits if size > limits.message_bytes]
    over = [
        (oid, msg)
        for (oid, _), msg in zip(long, message_sizes(git_dir, quarantine, long), strict=True)
        if msg > limits.message_bytes
    ]
    for oid, msg in over[:SHOW]:
        out.append(
            f"kovanex: commit {oid[:12]}: its message is {human(msg)}; the limit is "
            f"{human(limits.message_bytes)} (limits.message_bytes); put long text in "
            "a file of the branch and reword the commit (git commit --amend)"
        )
    if len(over) > SHOW:
        out.append(f"kovanex: and {len(over) - SHOW} more commits over limits.message_bytes")
    named = {oid for oid, _ in over}  # one refusal per object: its message says it all
    big = [o for o in objs if o[2] > limits.object_bytes and o[0] not in named]
    for oid, kind, size in big[:SHOW]:
        out.append(
            f"kovanex: {kind} {oid[:12]} is {human(size)}; the limit is "
            f"{human(limits.object_bytes)} per object (limits.object_bytes); keep large "
            "files out of the repo (an artifact store, or git LFS)"
        )
    if len(big) > SHOW:
        out.append(f"kovanex: and {len(big) - SHOW} more objects over limits.object_bytes")
    return out
