"""Stopping on time: the agent is gone within STOP_DEADLINE_S of SIGTERM, whatever it does.

A stop can come while the agent is still starting (a half-start waiting on a peer), while
a client holds an event stream open, or while a child (git, a step, nats-server) does not
die. Three guards, from polite to final: start-up is raced against the stop and abandoned;
each service closes under its own short timeout, so one that hangs does not hold the rest;
and a watchdog thread, armed at the first stop request, ends the process at the deadline
even if the event loop itself is stuck. What a hard exit leaves (a step's processes, a
pidfile) is what `kill -9` leaves, and the next start already cleans that up (ADR 0064).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Awaitable

from kovanex.clock import SYSTEM, Clock

log = logging.getLogger("kovanex.agent")
STOP_DEADLINE_S = 9.0  # systemd and the bound: 10 s from SIGTERM to exit
STEP_TIMEOUT_S = 2.0  # one service's close; the runs get RUNS_TIMEOUT_S
RUNS_TIMEOUT_S = 4.0


class StopWatch:
    """Arms once; at the deadline it logs what was still closing and exits the process."""

    def __init__(
        self,
        name: str,
        deadline_s: float = STOP_DEADLINE_S,
        clock: Clock = SYSTEM,
        hard_exit: bool = True,
    ) -> None:
        self.name = name
        # False where the agent shares its process (kovanex/simreal/cluster.py): the
        # deadline is only logged, and never ends the other agents' process
        self.hard_exit = hard_exit
        self.clock = clock  # the services' close timeouts; the watchdog stays on real time
        self.deadline_s = deadline_s
        self.stage = "starting"
        self._armed: threading.Timer | None = None

    def arm(self) -> None:
        if self._armed is not None:
            return
        self._armed = threading.Timer(self.deadline_s, self._expire)
        self._armed.daemon = True  # never what keeps the process alive
        self._armed.start()

    def stopped(self) -> None:
        """Every service closed: a watchdog firing after this has nothing to report."""
        self.stage = "stopped"

    def _expire(self) -> None:
        if not self.hard_exit:
            if self.stage != "stopped":
                log.error("agent %s did not stop within %.0f s (still %s)", *self._late())
            return
        log.error(
            "agent %s did not stop within %.0f s (still %s); exiting now: what it left "
            "behind is cleaned up at the next start",
            *self._late(),
        )
        for h in logging.getLogger().handlers:
            try:
                h.flush()
            except Exception:  # noqa: BLE001, S110 - exiting anyway
                pass
        os._exit(1)

    def _late(self) -> tuple[str, float, str]:
        return self.name, self.deadline_s, self.stage


async def bounded(watch: StopWatch, name: str, step: Awaitable[object], timeout: float) -> None:
    """Close one service, but never wait on it past `timeout`, nor let its error stop the
    others from closing."""
    watch.stage = f"closing {name}"
    try:
        await watch.clock.wait_for(step, timeout)
    except TimeoutError:
        log.warning("stopping: %s did not close within %.0f s; going on", name, timeout)
    except Exception:  # noqa: BLE001 - the next service still closes
        log.exception("stopping: closing %s failed", name)
