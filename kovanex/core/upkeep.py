"""When a repo's housekeeping runs, pure: archiving finished tasks and `git maintenance`.

Why a decider: the schedule is what keeps a repo's cost flat as tasks accumulate (ADR
0031), and it must not run on every start (a restart would repack a big repo each time)
nor never. The shell (agent/upkeep.py) persists the last runs, passes `now` and the repos
it owns, and carries out the jobs; the fake clock tests drive this class directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ARCHIVE = "archive"
MAINTENANCE = "maintenance"
KINDS = (ARCHIVE, MAINTENANCE)  # archive first: maintenance then packs what moved
ARCHIVE_CHECK_MIN_S = 60.0
ARCHIVE_CHECK_MAX_S = 3600.0


@dataclass(frozen=True)
class Job:
    repo: str
    kind: str


def archive_every(archive_after_s: float) -> float:
    """How often to look for tasks to archive: often enough that none stays live much
    past its age, at most hourly, at least a minute apart."""
    return min(ARCHIVE_CHECK_MAX_S, max(ARCHIVE_CHECK_MIN_S, archive_after_s))


class Upkeep:
    """The last run of each (repo, kind) and the rule: a job is due when it never ran
    or its interval has passed since it last did."""

    def __init__(
        self,
        archive_after_s: float,
        maintenance_every_s: float,
        last: Mapping[str, float] | None = None,
    ) -> None:
        self.every = {ARCHIVE: archive_every(archive_after_s), MAINTENANCE: maintenance_every_s}
        self.last: dict[str, float] = dict(last or {})  # "kind repo" -> time it last ran

    @staticmethod
    def _key(job: Job) -> str:
        return f"{job.kind} {job.repo}"

    def due(self, now: float, repos: Iterable[str]) -> list[Job]:
        out = []
        for repo in sorted(repos):
            for kind in KINDS:
                last = self.last.get(self._key(Job(repo, kind)))
                if last is None or now - last >= self.every[kind] or last > now:
                    out.append(Job(repo, kind))
        return out

    def done(self, job: Job, now: float) -> None:
        self.last[self._key(job)] = now

    def next_due(self, now: float, repos: Iterable[str]) -> float:
        """Seconds until the next job is due (0 when one is due now)."""
        waits = [
            max(0.0, self.last.get(self._key(Job(r, k)), now) + self.every[k] - now)
            if self._key(Job(r, k)) in self.last
            else 0.0
            for r in repos
            for k in KINDS
        ]
        return min(waits, default=max(self.every.values()))
