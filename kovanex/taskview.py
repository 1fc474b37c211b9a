"""What `kovanex task show` prints and GetTask answers: one task read from its ledger.

Below both the CLI and the API (each imports it; neither imports the other): the state,
the steps with their results, every placement and every reconciliation, from git alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kovanex.core import task as taskcore
from kovanex.gitstate.refs import task_ref

if TYPE_CHECKING:
    from kovanex.gitstate.ledger import TaskLedger


def task_row(repo: str, task_id: str, view: Any) -> dict[str, Any]:
    """A task as ListTasks and the task writes answer it: the view's headline fields."""
    return {
        "id": task_id,
        "repo": repo,
        "state": view.state,
        "node": view.node,
        "epoch": view.epoch,
        "reason": view.reason or "",
        "attempt": view.attempt,
        "tip": view.tip,
    }


def describe(repo: str, led: TaskLedger, task_id: str) -> dict[str, Any]:
    from kovanex import spec as specmod

    view = led.read(task_id)
    data = led.spec_bytes(task_id)
    names: list[str] = []
    try:
        spec = specmod.load_spec(data or b"", specmod.SPEC_PATH)
        names = [s.name for s in spec.steps]
    except specmod.SpecError:
        spec = None
    results: dict[int, dict[str, Any]] = {}
    placements = []
    reconciled = []  # merges after a partition healed (ADR 0028): which sides, which tips
    for oid, tr, _subject in reversed(led.history(task_id)):
        if tr is None:
            results.clear()
            placements.clear()
            continue
        if "Reconciled" in tr.extra:
            reconciled.append({"commit": oid, "sides": tr.extra["Reconciled"]})
        if tr.state == taskcore.PLACED:
            placements.append({"node": tr.node, "epoch": tr.epoch, "commit": oid, **tr.extra})
        if tr.step is not None:
            results[tr.step] = {
                "result": tr.result,
                "exit_code": tr.exit_code,
                "commit": oid,
                "node": tr.node,
                "epoch": tr.epoch,
            }
    steps = []
    for i, name in enumerate(names):
        r = results.get(i, {})
        state = r.get("result") or "pending"
        if i in view.steps_ok:
            state = "ok"
        elif not r and view.state == taskcore.RUNNING and i == taskcore.next_step(view, len(names)):
            state = "running"
        steps.append(
            {
                "index": i + 1,
                "name": name,
                "state": state,
                **{k: v for k, v in r.items() if k != "result"},
            }
        )
    return {
        **task_row(repo, task_id, view),
        "reason": view.reason,
        "archived": led.ref_of is not task_ref,
        "kind": spec.kind if spec else None,
        "steps": steps,
        "placements": placements,
        "reconciled": reconciled,
    }
