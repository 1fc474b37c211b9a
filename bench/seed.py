"""Fill a bare repo with N finished tasks fast: one `git fast-import` stream, not the agent.

Each task is what the agent leaves behind: the user's commit with `.kovanex/task.toml`,
then `queued`, `placed`, `running`, a step and `succeeded` transitions with the real
subjects and trailers (kovanex.gitstate.ledger builds them), dated `age_s` ago.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from kovanex.core import task as taskcore
from kovanex.core.task import Transition
from kovanex.gitstate import gitcli, trailers
from kovanex.gitstate.ledger import subject_for

SPEC = b'[[steps]]\nname = "s"\nrun = "true"\n'


def _transitions(node: str) -> list[Transition]:
    return [
        Transition(state=taskcore.QUEUED, epoch=0, extra={"Priority": "50"}),
        Transition(state=taskcore.PLACED, epoch=1, node=node),
        Transition(state=taskcore.RUNNING, epoch=1, node=node),
        Transition(
            state=taskcore.RUNNING,
            epoch=1,
            node=node,
            step=0,
            total=1,
            step_name="s",
            result="ok",
            exit_code=0,
        ),
        Transition(state=taskcore.SUCCEEDED, epoch=1, node=node),
    ]


def stream(n: int, prefix: str, when: int, node: str = "n1") -> bytes:
    """The fast-import stream for `n` finished tasks `<prefix><i>`."""
    out = [b"blob\nmark :1\n", b"data %d\n%s\n" % (len(SPEC), SPEC)]
    mark = 1
    trs = _transitions(node)
    for i in range(n):
        tid = f"{prefix}{i}"
        ref = f"refs/heads/task/{tid}".encode()
        msgs = [f"task {tid}\n"]
        for tr in trs:
            msgs.append(
                trailers.build_message(
                    subject_for(tid, tr), [(taskcore.T_TASK, tid), *tr.to_trailers()], ""
                )
            )
        for k, msg in enumerate(msgs):
            mark += 1
            body = msg.encode()
            who = b"u <u@x>" if k == 0 else b"kovanex n1 <kovanex+n1@localhost>"
            out.append(b"commit %s\nmark :%d\n" % (ref, mark))
            out.append(b"author %s %d +0000\ncommitter %s %d +0000\n" % (who, when, who, when))
            out.append(b"data %d\n%s\n" % (len(body), body))
            if k == 0:
                out.append(b"M 100644 :1 .kovanex/task.toml\n\n")
            else:
                out.append(b"from :%d\n\n" % (mark - 1))
    return b"".join(out)


def seed(repo: Path, n: int, prefix: str = "old", age_s: float = 30 * 86400) -> None:
    """Add `n` finished tasks to the bare repo `repo`, committed `age_s` ago."""
    if n <= 0:
        return
    data = stream(n, prefix, int(time.time() - age_s))
    subprocess.run(
        gitcli.command(["fast-import", "--quiet", "--done"], git_dir=repo),
        input=data + b"done\n",
        check=True,
        env=gitcli.env(),
        cwd="/",
    )
