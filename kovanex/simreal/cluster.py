"""N real agents in one process: the real `Agent` under the simulator (issue 25 part 3).

Each agent is a real `kovanex.agent.daemon.Agent` over its own `kovanex init` data dir,
with real bare repos, git hooks, HTTP on loopback and step processes. What is simulated is
the gossip network: every agent's transport is a `MemoryTransport` on one `MemoryNetwork`,
so loss, delay and partitions are chosen by the harness (a seeded RNG), not by the host.

Each agent runs on its own event loop in its own thread, as it would in its own process.
Why not one loop: a crash must be `kill -9`, not a cancel. Cancelling an agent's tasks
runs their `finally` and `except` blocks (the step runner kills its process group there),
which is a graceful stop in disguise. A stopped loop that is never run again runs nothing
more of that agent: no callback, no timer, no `finally`. Its sockets are then released as
the kernel does for a dead process, and its step processes keep running, as they do after
`kill -9`; the restarted agent (a new `Agent` over the same data dir) must deal with them.
See ADR 0110 for what runs real, what is faked and the limits of determinism.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from kovanex import config as cfgmod
from kovanex.agent.daemon import Agent
from kovanex.net.transport import Addr, MemoryNetwork, MemoryTransport

T = TypeVar("T")
START_S = 30.0  # an agent that is not ready by then failed to start
# Loops of crashed agents: never run again, never collected while the process lives (a
# collected coroutine would run its `finally` blocks, which `kill -9` never does).
_GRAVEYARD: list[tuple[asyncio.AbstractEventLoop, Any]] = []
_LOOP_GONE = ("Event loop is closed", "no running event loop")


def _quiet_graveyard() -> None:
    """At exit the interpreter does collect the crashed agents' coroutines, and their
    `finally` blocks find no loop: those errors (and only those) are not reported."""
    if not _GRAVEYARD:
        return
    default = sys.unraisablehook

    def hook(u: Any) -> None:
        if isinstance(u.exc_value, RuntimeError) and str(u.exc_value) in _LOOP_GONE:
            return
        default(u)

    sys.unraisablehook = hook


atexit.register(_quiet_graveyard)


class AgentHost:
    """One agent on its own event loop thread: what one process is for a real node."""

    def __init__(self, name: str, data: Path, net: MemoryNetwork) -> None:
        self.name = name
        self.data = data
        self.layout = cfgmod.Layout(data)
        self.net = net
        self.agent: Agent | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.up = False
        self.up_since = 0.0  # monotonic time the current agent became ready
        self.starts = 0
        self.error: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self, timeout: float = START_S) -> None:
        """Build a fresh Agent over the data dir and wait until it is ready."""
        if self.up:
            raise RuntimeError(f"agent {self.name} is already up")
        for stale in ("hook", "agent.sock"):  # a crashed agent leaves them, as kill -9 does
            (self.layout.run / stale).unlink(missing_ok=True)
        ready = threading.Event()
        self.error = None
        self.starts += 1
        self.thread = threading.Thread(
            target=self._main, args=(ready,), name=f"agent-{self.name}", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.05):
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"agent {self.name} did not start: {self.error!r}")
        self.up, self.up_since = True, time.monotonic()

    def _main(self, ready: threading.Event) -> None:
        from kovanex.node import front  # the /v1 API and /ui/ over the agent, as run_agent

        loop = self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        async def serve() -> None:
            cfg = cfgmod.load(self.layout)
            self.agent = Agent(
                self.layout, cfg, front, transport=MemoryTransport(self.net), owns_process=False
            )
            await self.agent.run(ready.set)

        main = loop.create_task(serve())
        try:
            loop.run_until_complete(main)
        except RuntimeError as e:
            if not main.done():  # crash(): the loop was stopped under the agent
                for t in asyncio.all_tasks(loop):
                    t._log_destroy_pending = False  # type: ignore[attr-defined] # never resumed
                _GRAVEYARD.append((loop, main))
                return
            self.error = e
        except BaseException as e:  # noqa: BLE001 - reported by start() and stop()
            self.error = e
        try:  # what asyncio.run does after its main: the leftovers are cancelled
            for _ in range(3):  # a cancelled task may leave one more behind
                left = asyncio.all_tasks(loop)
                if not left:
                    break
                for t in left:
                    t.cancel()
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()

    def call(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """`fn()` run on the agent's own loop thread (its state is not thread-safe)."""
        loop = self.loop
        if not self.up or loop is None:
            raise RuntimeError(f"agent {self.name} is down")
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)

        loop.call_soon_threadsafe(run)
        return fut.result(timeout)

    def stop(self, timeout: float = 20.0) -> None:
        """A graceful stop, as SIGTERM asks."""
        if not self.up or self.loop is None or self.agent is None:
            return
        self.loop.call_soon_threadsafe(self.agent.ctx.stop_event.set)
        assert self.thread is not None
        self.thread.join(timeout)
        self.up = False
        if self.thread.is_alive():
            raise RuntimeError(f"agent {self.name} did not stop within {timeout}s")

    def crash(self) -> None:
        """`kill -9`: the loop stops dead between two callbacks and never runs again; the
        agent's sockets are released, its gossip endpoint leaves the network, its step
        processes keep running."""
        loop, agent, thread = self.loop, self.agent, self.thread
        if not self.up or loop is None or agent is None or thread is None:
            return
        self.up = False
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        if thread.is_alive():
            raise RuntimeError(f"agent {self.name}'s loop did not stop")
        release_sockets(loop)
        tr = agent.cluster.node.transport
        if isinstance(tr, MemoryTransport):
            tr.closed = True
            self.net.endpoints.pop(tr.local_addr, None)
        if agent.watcher is not None:
            agent.watcher.stop()  # its inotify thread would die with the process

    @property
    def gossip_addr(self) -> Addr:
        return cfgmod.parse_addr(cfgmod.load(self.layout).gossip_bind)


def release_sockets(loop: asyncio.AbstractEventLoop) -> None:
    """Close every socket the stopped loop watched, as the kernel does when a process
    dies: each fd is pointed at /dev/null (dup2), so the socket itself is closed (peers
    see refused connects and resets) while the fd number stays taken until the objects
    that hold it are collected: nothing else can be closed by mistake."""
    selector = getattr(loop, "_selector", None)  # asyncio's selector loops: all of ours
    if selector is None:
        return
    own = {getattr(loop, "_ssock", None), getattr(loop, "_csock", None)}
    keep = {s.fileno() for s in own if s is not None}
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for key in list(selector.get_map().values()):
            if key.fd not in keep:
                try:
                    os.dup2(null, key.fd)
                except OSError:
                    pass
    finally:
        os.close(null)


class RealCluster:
    """N agents over one MemoryNetwork, with the faults a seeded RNG chooses."""

    def __init__(
        self,
        root: Path,
        names: Iterable[str],
        seed: int = 0,
        caps: dict[str, list[str]] | None = None,
        init_args: Iterable[str] = (),
    ) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.net = MemoryNetwork()
        self.net.drop = self._cut
        self.net.lose = self._lost
        self.net.delay = self._delay
        self.groups: list[set[Addr]] = []  # a partition: packets cross no group border
        self.loss = 0.0
        self.max_delay = 0.0
        self.hosts: dict[str, AgentHost] = {}
        self.watches: list[Any] = []  # kovanex.simreal.checks.Watch: what it saw is killed
        token: Path | None = None
        for name in names:
            data = root / name
            extra = ["--capabilities", ",".join((caps or {}).get(name, []))]
            if token is not None:
                extra += ["--token-file", str(token)]
            init_node(data, name, [*extra, *init_args])
            token = token or cfgmod.Layout(data).token_file
            self.hosts[name] = AgentHost(name, data, self.net)
        addrs = {n: cfgmod.load(h.layout).gossip_bind for n, h in self.hosts.items()}
        for name, h in self.hosts.items():  # everyone joins everyone: any restart rejoins
            cfg = cfgmod.load(h.layout)
            cfg.join = [a for n, a in addrs.items() if n != name]
            cfgmod.save(h.layout, cfg)

    def __getitem__(self, name: str) -> AgentHost:
        return self.hosts[name]

    def start(self) -> None:
        for h in self.hosts.values():
            h.start()

    def up(self) -> list[AgentHost]:
        return [h for h in self.hosts.values() if h.up]

    def close(self) -> None:
        """Stop every agent, then kill any step a crash left running that no restart did."""
        for h in self.hosts.values():
            try:
                h.stop()
            except RuntimeError:
                h.crash()
        for w in self.watches:
            w.kill_leftovers()

    # -- faults ------------------------------------------------------------------------
    def partition(self, *groups: Iterable[str]) -> None:
        """Cut gossip between the groups (names left out form one more group)."""
        named = [set(g) for g in groups]
        rest = set(self.hosts) - set().union(*named)
        self.groups = [{self.hosts[n].gossip_addr for n in g} for g in [*named, rest] if g]

    def heal(self) -> None:
        self.groups = []

    def _cut(self, src: Addr, dst: Addr) -> bool:
        return bool(self.groups) and not any(src in g and dst in g for g in self.groups)

    def _lost(self, src: Addr, dst: Addr) -> bool:
        return self.loss > 0 and self.rng.random() < self.loss

    def _delay(self, src: Addr, dst: Addr) -> float:
        return self.rng.uniform(0, self.max_delay) if self.max_delay > 0 else 0.0

    def crash(self, name: str) -> None:
        self.hosts[name].crash()

    def restart(self, name: str) -> None:
        self.hosts[name].start()


def init_node(data: Path, name: str, extra: list[str]) -> None:
    """`kovanex init`, the real CLI: no compute units (no users, no cgroups to leave
    behind), the local gossip profile, no global git config touched."""
    cmd = [sys.executable, "-m", "kovanex", "init", "--name", name, "--units", "none"]
    cmd += ["--bind", "127.0.0.1:0", "--no-git-config", "--profile", "local", *extra]
    cmd += ["--data", str(data)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"kovanex init {name} failed: {p.stdout}{p.stderr}")
