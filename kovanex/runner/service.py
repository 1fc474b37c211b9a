"""Deployments: keep a long-running command up, restarting it with backoff.

A service run is a step with no deadline: same session, limits, clean env and log,
so everything the step runner guarantees (whole-tree kill, no leaked processes)
holds for services too.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kovanex.core.backoff import Backoff
from kovanex.inputlimits import DEFAULT as DEFAULT_LIMITS
from kovanex.runner.limits import Limits
from kovanex.runner.process import KILL_GRACE_S, KILLED, _append, run_step
from kovanex.runner.units import Unit
from kovanex.runner.zygoteclient import Zygote


@dataclass(frozen=True, slots=True)
class ServiceOutcome:
    """Why supervision ended (always a cancel) and how the service fared until then."""

    restarts: int
    last_exit_code: int | None
    last_result: str
    limit_mechanism: str


async def supervise(
    command: str,
    *,
    cwd: Path,
    env: dict[str, str],
    log_path: Path,
    limits: Limits | None,
    cancel: asyncio.Event,
    backoff: Backoff,
    on_restart: Callable[[int, float], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    kill_grace_s: float = KILL_GRACE_S,
    unit: Unit | None = None,
    hide: list[Path] | None = None,
    log_max_bytes: int = DEFAULT_LIMITS.node_log_bytes,
    zygote: Zygote | None = None,
) -> ServiceOutcome:
    """Run `command` until `cancel` is set, restarting it whenever it exits.

    `on_restart(n, delay)` is called before the n-th restart's delay; `on_start(pid)`
    on every start. Any exit, even 0, is a restart: a service is meant to stay up.
    """
    restarts = 0
    last_code: int | None = None
    last_result = ""
    mechanism = "none"
    while not cancel.is_set():
        started = clock()
        out = await run_step(
            command,
            cwd=cwd,
            env=env,
            timeout_s=math.inf,
            log_path=log_path,
            limits=limits,
            cancel=cancel,
            on_start=on_start,
            kill_grace_s=kill_grace_s,
            unit=unit,
            hide=hide,
            log_max_bytes=log_max_bytes,
            zygote=zygote,
        )
        mechanism, last_result = out.limit_mechanism, out.result
        if out.result == KILLED:
            break
        last_code = out.exit_code
        delay = backoff.next_delay(clock(), started)
        restarts += 1
        _append(
            log_path,
            f"service exited ({out.result}, code {last_code}); restart {restarts} in {delay:g}s",
        )
        if on_restart is not None:
            on_restart(restarts, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cancel.wait(), delay)
    return ServiceOutcome(restarts, last_code, last_result or KILLED, mechanism)
