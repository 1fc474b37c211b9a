"""The task every peer runs in bench/peer_bench.py, defined once per queue library.

Each task records when it started (`<PEER_DIR>/<id>.start`), spawns `sh -c true` as a
Kovanex step does, and marks itself done (`<id>.done`); the bench reads the files, so no
result backend is involved. Configured by environment: PEER_DIR, PEER_BROKER (celery's
redis URL), PEER_HUEY_DB (huey's SQLite file); rq's workers import `trivial` by name. Imported by the workers the bench starts.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def trivial(task_id: str) -> None:
    d = Path(os.environ["PEER_DIR"])
    (d / f"{task_id}.start").write_text(repr(time.time()))
    subprocess.run(["sh", "-c", "true"], check=True)
    (d / f"{task_id}.done").write_text("")


def celery_app():  # noqa: ANN201 - celery is an optional extra: imported only here
    from celery import Celery

    app = Celery("peer", broker=os.environ.get("PEER_BROKER", "redis://127.0.0.1:6379/0"))
    app.conf.update(task_ignore_result=True, worker_prefetch_multiplier=1, task_acks_late=False)
    return app, app.task(name="trivial")(trivial)


def huey_app():  # noqa: ANN201
    from huey import SqliteHuey

    h = SqliteHuey("peer", filename=os.environ.get("PEER_HUEY_DB", "peer.db"), results=False)
    return h, h.task(name="trivial")(trivial)


def rq_queue(url: str):  # noqa: ANN201
    from redis import Redis
    from rq import Queue

    return Queue("peer", connection=Redis.from_url(url))


if os.environ.get("PEER_APP") == "celery":  # in the worker: `celery -A bench.peer_apps`
    app, _ = celery_app()
elif os.environ.get("PEER_APP") == "huey":  # `huey_consumer bench.peer_apps.huey`
    huey, _ = huey_app()
