"""Per-repo housekeeping on the owner: archive finished tasks older than
`[maintenance] archive_after`, and run `git maintenance` every `[maintenance] every`
(ADR 0031). When is the pure core's (`core/upkeep.py`); this service carries it out.

The last runs are kept in `<data>/upkeep.json`, so a restart does not repack every repo
again. The work is local git in a worker thread or a child (git, or for a big repo's
archive `gitstate/tipscan.py`: ADR 0043), never under a task lock:
archiving is compare-and-swap on each tip (gitstate/archive.py), so a task resubmitted
meanwhile stays where it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from kovanex import config as cfgmod
from kovanex.agent.context import NodeContext
from kovanex.agent.heaptrim import trim_heap
from kovanex.agent.repos import RepoIndex
from kovanex.core import upkeep
from kovanex.gitstate import gitcli, tipscan

log = logging.getLogger("kovanex.agent")
# pack-refs: archived refs leave the loose-ref directory; loose-objects: one transition
# commit is one loose object; commit-graph keeps walks from growing with history, and a
# geometric repack keeps the number of packs logarithmic. Never `gc`: it would prune what
# a replica still stages (a geometric repack keeps every object of the packs it rolls up).
MAINTENANCE_TASKS = ("loose-objects", "commit-graph")  # after `pack-refs` (its own command)
# No multi-pack-index (issue 11): libgit2 reads one whole when it opens it, and the
# agent's smaps at 10,000 tasks showed 8.5 MB of a 1.7 MB file resident (mapped by
# several open handles). `incremental-repack` needs one; a geometric repack does not.
MIDX = Path("objects") / "pack" / "multi-pack-index"
MAINTENANCE_TIMEOUT_S = 1800.0
PACK_REFS = ["pack-refs", "--all", "--prune"]
RECHECK_S = 60.0  # a new repo is picked up within this


def release_memory() -> None:
    """After a pass over every task of a big repo (a first start, an archive run), give
    the freed heap back: Python and glibc keep it otherwise, and idle RSS would carry a
    one-off peak for the agent's lifetime."""
    gc.collect()
    trim_heap()  # not glibc: nothing to trim


def maintenance_commands(path: Path) -> list[list[str]]:
    """`pack-refs` (what maintenance's pack-refs task runs; first and alone, because it is
    the one that rewrites refs: the watcher is paused for it), the other tasks, then drop
    the loose objects the loose-objects task just packed (it only drops them on its next
    run), then roll small packs up (`repack --geometric`)."""
    out = [PACK_REFS, ["maintenance", "run", *[f"--task={t}" for t in MAINTENANCE_TASKS]]]
    out.append(["prune-packed", "--quiet"])
    out.append(["repack", "--geometric=2", "-d", "-q"])
    return out


class UpkeepService:
    def __init__(
        self,
        ctx: NodeContext,
        repos: RepoIndex,
        forget: Callable[[tuple[str, str]], None],
        state_file: Path,
        *,
        quiet: Callable[[str], None] = lambda repo: None,
        loud: Callable[[str], None] = lambda repo: None,
    ) -> None:
        self.ctx = ctx
        self.repos = repos
        self.forget = forget  # the scheduler drops what it kept about an archived task
        self.state_file = state_file
        self.archive_after = cfgmod.parse_duration(ctx.cfg.archive_after)
        every = cfgmod.parse_duration(ctx.cfg.maintenance_every)
        self.core = upkeep.Upkeep(self.archive_after, every, self._load())
        self.runs = 0  # jobs carried out (kovanex status, tests)
        # the ref watcher leaves a repo alone while a job rewrites its refs, then watches
        # it again and the repo is read once (RefWatcher.pause)
        self.quiet = quiet
        self.loud = loud
        self.rewriting: set[str] = set()  # repos whose refs a job is rewriting now

    def _load(self) -> dict[str, float]:
        try:
            data = json.loads(self.state_file.read_text())
            return {str(k): float(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def _save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.core.last, sort_keys=True))
        tmp.replace(self.state_file)

    async def run_due(self) -> int:
        """Carry out every job due now; returns how many ran."""
        n = 0
        for job in self.core.due(self.ctx.clock.time(), self.repos.owned()):
            try:
                await self._do(job)
            except Exception as e:  # noqa: BLE001 - retried at its next interval
                log.warning("%s: %s failed: %s", job.repo, job.kind, e)
            self.core.done(job, self.ctx.clock.time())
            n += 1
        if n:
            self.runs += n
            await asyncio.to_thread(self._save)
        return n

    async def _do(self, job: upkeep.Job) -> None:
        path = self.repos.path(job.repo)
        if not path.exists():
            return
        if job.kind == upkeep.ARCHIVE:
            async with self._unwatched(job.repo):
                moved = await self._archive(job.repo, path)
            if moved:
                release_memory()  # here, not in _archive: its frame still holds every tip
        else:
            for args in maintenance_commands(path):
                async with (
                    self._unwatched(job.repo) if args == PACK_REFS else contextlib.nullcontext()
                ):
                    await gitcli.run_async(args, git_dir=path, timeout=MAINTENANCE_TIMEOUT_S)
            # one left by an earlier incremental-repack: optional, and readers fall back to
            # each pack's own index; one that is open stays valid until it is closed
            (path / MIDX).unlink(missing_ok=True)

    @contextlib.asynccontextmanager
    async def _unwatched(self, repo: str) -> AsyncIterator[None]:
        """The ref watcher leaves the repo alone while we rewrite its refs by the thousand
        (their echo cost ~60 MB of RSS at 10,000 tasks), then the repo is read once."""
        self.quiet(repo)
        self.rewriting.add(repo)
        try:
            yield
        finally:
            self.rewriting.discard(repo)
            self.loud(repo)

    async def _archive(self, repo: str, path: Path) -> int:
        """Archive the repo's finished tasks that are due; how many moved."""
        now = self.ctx.clock.time()
        # a big repo's parse and ref moves happen in a child process (ADR 0043)
        moved = await tipscan.archive_async(path, now, self.archive_after)
        for task_id in moved:
            self.forget((repo, task_id))
        if moved:
            log.info("%s: archived %d finished task(s)", repo, len(moved))
        return len(moved)

    async def run(self) -> None:
        while True:
            try:
                await self.run_due()
            except Exception:
                log.exception("upkeep failed")
            wait = self.core.next_due(self.ctx.clock.time(), self.repos.owned())
            await self.ctx.clock.sleep(min(max(wait, 1.0), RECHECK_S))
