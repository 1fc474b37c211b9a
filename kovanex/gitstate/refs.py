"""The one module that names refs (ADR 0017): every ref prefix Kovanex reads or writes.

Why one: prefixes were spelled out in a dozen modules ("refs/heads/task/" in the ledger,
the daemon, failover, the CLI, pushcheck), so a rename or a new namespace meant a grep and
a hope. Stdlib-only and import-light: the hooks' slow path and pushcheck import it.

Layout:
- `refs/heads/task/<id>`: one task's ledger branch (`task_ref`, `task_id_of`).
- `refs/kovanex/meta`: the repo's ownership record (defined by the pure core, re-exported).
- `refs/kovanex/staging/refs/...`: what a replica last fetched from its owner, before apply.
- `refs/kovanex/staging/sync/<ref>`: commits a `sync` owner pushed and a replica acked;
  outside `staging/refs/` so a full fetch's --prune never removes them.
- `refs/kovanex/lost/<epoch>/<ref>`: what a demoted owner or a resyncing replica held that
  the new owner lacks (forensics; never mirrored).
- `refs/kovanex/staging/reconcile/<epoch>/<node>/<ref>`: a deposed owner's diverged tip,
  pushed to the surviving owner, which merges it into `<ref>` (ADR 0028).
- `refs/kovanex/skip/`: markers that tell the agent not to schedule a ref.
- `refs/kovanex/archive/<id>`: a finished task's branch after archiving (`archive_ref`);
  hidden from clients' ref advertisement (`HIDDEN`), replicated like task refs.
- `refs/heads/env/<name>`: an environment's release history, one commit per promotion;
  only the agent moves it (ADR 0021), a push there is refused.
- `refs/heads/promote/<version>`, `refs/tags/<version>`: pushing one starts a promotion.
- `refs/heads/promotion/<env>/<version>`: one promotion's life (gates, approvals...).
"""

from __future__ import annotations

import re

from kovanex.core.replication import META_REF

REFS = "refs/"
HEADS = "refs/heads/"
TASK_PREFIX = "refs/heads/task/"
KOVANEX = "refs/kovanex/"
# githttp sets it in the hooks' env from the credential alone (node | http): refs under
# KOVANEX take pushes from nodes only (kovanex/pushcheck.py, ADR 0063)
PUSH_VIA = "KOVANEX_PUSH_VIA"
STAGING = "refs/kovanex/staging/"
STAGING_REFS = STAGING + "refs/"
SYNC_STAGING = STAGING + "sync/"
RECONCILE = STAGING + "reconcile/"
LOST = "refs/kovanex/lost/"
OFFERED = LOST + "offered/"
SKIP_PREFIX = "refs/kovanex/skip/"
ARCHIVE = "refs/kovanex/archive/"
# Namespaces a client's push or fetch never sees advertised (receive/uploadpack.hideRefs),
# so their cost does not grow with history; cluster peers see them (githttp unhides).
HIDDEN = (ARCHIVE,)
ENV_PREFIX = "refs/heads/env/"
PROMOTE_PREFIX = "refs/heads/promote/"
PROMOTION_PREFIX = "refs/heads/promotion/"
TAG_PREFIX = "refs/tags/"

_TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def valid_task_id(task_id: str) -> bool:
    """The id pattern, minus what git refuses in a ref name ("..", a ".lock" or "." ending)."""
    return (
        bool(_TASK_ID.match(task_id))
        and ".." not in task_id
        and not task_id.endswith((".lock", "."))
    )


def _ref_of(prefix: str, task_id: str) -> str:
    if not valid_task_id(task_id):
        raise ValueError(f"invalid task id {task_id!r}")
    return prefix + task_id


def _id_of(prefix: str, ref: str) -> str | None:
    if not ref.startswith(prefix):
        return None
    tid = ref[len(prefix) :]
    return tid if valid_task_id(tid) else None


def task_ref(task_id: str) -> str:
    return _ref_of(TASK_PREFIX, task_id)


def task_id_of(ref: str) -> str | None:
    """The task id of a task ref, None for any other ref (including a nested task/a/b)."""
    return _id_of(TASK_PREFIX, ref)


def archive_ref(task_id: str) -> str:
    return _ref_of(ARCHIVE, task_id)


def archived_id_of(ref: str) -> str | None:
    """The task id of an archive ref, None for any other ref."""
    return _id_of(ARCHIVE, ref)


def env_ref(env: str) -> str:
    return ENV_PREFIX + env


def promotion_ref(env: str, version: str) -> str:
    return f"{PROMOTION_PREFIX}{env}/{version}"


def release_version_of(ref: str) -> str | None:
    """The version a pushed tag or `promote/<version>` ref names (None: neither)."""
    for prefix in (TAG_PREFIX, PROMOTE_PREFIX):
        if ref.startswith(prefix) and "/" not in ref[len(prefix) :]:
            return ref[len(prefix) :] or None
    return None


def lost_ref(epoch: int, ref: str) -> str:
    """Where `ref`'s old value is kept when the owner of epoch `epoch` is superseded."""
    return f"{LOST}{epoch}/{ref}"


def reconcile_ref(epoch: int, node: str, ref: str) -> str:
    """Where the deposed owner of `epoch`, `node`, offers its tip of `ref` to the survivor."""
    return f"{RECONCILE}{epoch}/{node}/{ref}"


def parse_reconcile_ref(name: str) -> tuple[int, str, str] | None:
    """(epoch, node, ref) of a `reconcile_ref`, None for anything else."""
    if not name.startswith(RECONCILE):
        return None
    epoch, _, rest = name[len(RECONCILE) :].partition("/")
    node, _, ref = rest.partition("/")
    if not epoch.isdigit() or not node or not ref.startswith(HEADS):
        return None
    return int(epoch), node, ref


def offered_ref(epoch: int, ref: str) -> str:
    """The deposed side's durable note that its lost tip of `ref` reached the survivor
    (under lost/: local, never mirrored); the tip is not offered again after a restart."""
    return f"{OFFERED}{epoch}/{ref}"


def sync_staging_ref(ref: str) -> str:
    return SYNC_STAGING + ref


def mirrored(refs: dict[str, str]) -> dict[str, str]:
    """The refs replication keeps equal: not scratch staging, not local forensics."""
    return {r: o for r, o in refs.items() if not r.startswith((STAGING, LOST))}


__all__ = [
    "ARCHIVE",
    "HIDDEN",
    "ENV_PREFIX",
    "HEADS",
    "KOVANEX",
    "LOST",
    "META_REF",
    "OFFERED",
    "RECONCILE",
    "PROMOTE_PREFIX",
    "PROMOTION_PREFIX",
    "REFS",
    "SKIP_PREFIX",
    "STAGING",
    "STAGING_REFS",
    "SYNC_STAGING",
    "TAG_PREFIX",
    "env_ref",
    "TASK_PREFIX",
    "archive_ref",
    "archived_id_of",
    "lost_ref",
    "mirrored",
    "offered_ref",
    "parse_reconcile_ref",
    "reconcile_ref",
    "promotion_ref",
    "release_version_of",
    "sync_staging_ref",
    "task_id_of",
    "task_ref",
    "valid_task_id",
]
