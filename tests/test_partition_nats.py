"""Issue 12 part 5: real partitions between real agents (each with its nats-server child),
one network namespace per node on a bridge, links cut by bringing a veth down.

One 5-node cluster serves the scenarios in order (starting it is the slow part); each one
heals fully before the next, and every one ends with the same checks (`healed`):
- split 2 | 3 with the leader on the minority side (so the leader is isolated from the
  quorum too), the minority owning an async repo with a consistent and a
  split_brain_allowed task;
- the owner of a sync repo (2 replicas) isolated alone: it refuses pushes, the majority
  takes the repo over, the consistent task halts, the split_brain_allowed one runs on;
- a flapping link under the leader: never two leaders for one term, one agreed leader
  after it.
During a partition: one leader, on the majority side; the minority halts its
absolute_consistency work within the lease TTL (measured from the cut, plus a stated
slack) and places none; split_brain_allowed work goes on. After the heal: one leader,
exactly one owner per repo that every node agrees on, reconciliation done, every
acknowledged commit of the whole run on a branch of its repo's owner, `git fsck` clean on
every node.

Timing: every wait is a condition with a deadline (`within`) scaled for a loaded 2-core
host; the only bound asserted is the one the issue sets (halt within the lease TTL).
Views are read through each agent's control socket (what `kovanex cluster status` and
`repo describe` call) and task states with the CLI's own reader, not one CLI process per
poll. Pushes run inside the pusher's namespace, so the hooks reach that node's agent.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kovanex import config as cfgmod
from kovanex.agent import control
from kovanex.cli.taskcmd import find_task
from kovanex.coordcfg import CoordinationConfig
from kovanex.core.replication import MemberView, choose_replicas
from kovanex.gitstate.refs import RECONCILE
from kovanex.taskview import describe
from tests.agentkit import Node, exchange_dir, fsck, git, wait_for
from tests.netnskit import Net, skip_reason
from tests.test_coordination_nats import agreed, gossip_addr

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
]
TOKEN = "t0ken-for-partition-tests"
N = 5
TTL_S = CoordinationConfig().lease_ttl_s
# A loaded 2-core host (seven helpers' suites at once) runs these agents several times
# slower than an idle one: deadlines are the idle figure times this factor. A deadline
# only bounds how long a failure takes to report; nothing waits for it to pass.
SLOW = float(os.environ.get("KOVANEX_TEST_SLOW", "5"))
# The one bound the issue sets: a node that cannot renew through a quorum halts its
# consistent work within the lease TTL. Measured from the cut, we allow the TTL plus this
# slack: one renewal interval (the decider's timer granularity), the kill of the step and
# the halted commit, and our own polling, on a loaded host.
HALT_SLACK_S = 4.0
FINAL = ("succeeded", "failed", "cancelled", "unschedulable")


def within(idle_s: float) -> float:
    return idle_s * SLOW


class NsNode(Node):
    """A Node whose agent (and `kovanex init`, so its ports are free there) runs inside a
    network namespace; so does its CLI, which talks to the agent over its HTTP listener."""

    def __init__(self, root: Path, name: str, net: Net, i: int) -> None:
        self.data = root / name
        self.name = name
        self.proc = None
        self.prefix = tuple(net.exec_prefix(i))
        addr = net.addrs[i]
        cmd = [*self.prefix, sys.executable, "-m", "kovanex", "--data", str(self.data), "init"]
        cmd += ["--name", name, "--bind", f"{addr}:0", "--http", f"{addr}:0", "--token", TOKEN]
        cmd += ["--coordination", "nats", "--labels", f"node={name}", "--units", "none"]
        # the 2 | 3 split pins six tasks to one node: enough slots for all of them (with
        # fewer, the owner places on a full node from a stale view of its slots, and the
        # placement deadline can exclude it: a separate gap, noted in the README)
        cmd += ["--runners", "8"]
        subprocess.run(cmd, check=True, capture_output=True)

    def ctl(self, op: str, **args: Any) -> Any:
        """The agent's control socket: what the CLI's `cluster status` / `repo ...` call."""
        return control.call(self.data / "run" / "agent.sock", op, **args)

    def kx(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [*self.prefix, sys.executable, "-m", "kovanex", *args, "--data", str(self.data)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if check and p.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
            )
        return p

    def view(self) -> dict[str, Any]:
        return self.ctl("cluster.status")

    def task(self, task: str) -> dict[str, Any]:
        """What `kovanex task show --format json` prints (its own reader, in process)."""
        return describe(*find_task(cfgmod.Layout(self.data), task, None), task)

    def git_in_ns(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        """git run inside this node's namespace: a push there reaches this node's agent
        through its hooks, as a user on that side of the partition would."""
        cmd = [*self.prefix, "git", *args]
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def kv_replicated(n: NsNode) -> bool:
    """The lease's KV stream has a replica on every server and each holds its whole log.
    A cut while a new replica still catches up lost the majority's writes (NATS 2.15: the
    term went back from 52 to 40 after the heal; ADR 0045)."""
    kv = n.view()["backend"].get("kv") or {}
    return kv.get("replicas") == N and kv.get("current") == N


@dataclass
class Cluster:
    net: Net
    nodes: list[NsNode]
    root: Path
    # repo -> every commit acknowledged to a user or written by an agent as settled,
    # across the whole run: the heal checks find each one on a branch of the owner
    acked: dict[str, set[str]] = field(default_factory=dict)
    done: list[tuple[str, str]] = field(default_factory=list)  # (repo, task) that finish
    # (old owner, repo, tasks pinned to it) where a heal deposed the owner: the last test
    # checks it placed none of them again (`healed` saw them finish under the new owner)
    deposed: list[tuple[NsNode, str, tuple[str, ...]]] = field(default_factory=list)


def view_of(n: Node) -> dict[str, Any]:
    assert isinstance(n, NsNode)
    return n.view()


def members_of(n: NsNode) -> set[str]:
    """The members n's gossip calls alive (what `kovanex members` lists as alive)."""
    return {m["name"] for m in n.ctl("members") if m["status"] == "alive"}


def leaders(nodes: list[NsNode]) -> dict[str, int]:
    """Nodes that call themselves leader right now, with their term."""
    out = {}
    for n in nodes:
        st = n.view()
        if any(r["role"] == "leader" and r["id"] == n.name for r in st["nodes"]):
            out[n.name] = st["term"]
    return out


def tip_message(n: Node, repo: str, task: str) -> str:
    return git("log", "-1", "--format=%B", f"refs/heads/task/{task}", cwd=n.repo(repo)).stdout


def heads(n: Node, repo: str, *refs: str) -> set[str]:
    """Every commit reachable from `refs` (all branches if none) in n's copy of repo."""
    args = list(refs) or ["--branches"]
    return set(git("rev-list", *args, cwd=n.repo(repo), check=False).stdout.split())


def placements(n: Node, repo: str, task: str, *refs: str) -> set[str]:
    """The `placed` commits of a task reachable from refs (its branch by default)."""
    args = list(refs) or [f"refs/heads/task/{task}"]
    out = git("log", "--format=%H %s", *args, cwd=n.repo(repo), check=False).stdout
    return {ln.split()[0] for ln in out.splitlines() if f"placed {task} on" in ln}


SPEC = """failover = "{failover}"
[placement]
labels = {{ node = "{node}" }}
[[steps]]
name = "one"
run = "echo one"
[[steps]]
name = "wait"
run = "date +%s.%N >> {x}/{task}.starts; while [ ! -f {x}/release ]; do sleep 0.1; done"
timeout_s = 600
"""


def push(
    c: Cluster, to: NsNode, repo: str, task: str, failover: str, x: Path, on: str = ""
) -> subprocess.CompletedProcess[str]:
    """Push a new task branch to `to` from inside its namespace (running on node `on`,
    `to` by default); an accepted push is recorded as acknowledged."""
    work = c.root / f"w-{task}"
    if not work.exists():  # a retried push sends the same commit again
        git("init", "-q", str(work))
        (work / ".kovanex").mkdir()
        spec = SPEC.format(failover=failover, node=on or to.name, x=x, task=task)
        (work / ".kovanex" / "task.toml").write_text(spec)
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", task, cwd=work)
    p = to.git_in_ns("push", "-q", str(to.repo(repo)), f"HEAD:refs/heads/task/{task}", cwd=work)
    if p.returncode == 0:
        c.acked.setdefault(repo, set()).add(git("rev-parse", "HEAD", cwd=work).stdout.strip())
    return p


def run_pair(c: Cluster, to: NsNode, repo: str, consistent: str, other: str, x: Path) -> None:
    """Push an absolute_consistency and a split_brain_allowed task to `to` (retried until
    acknowledged: a refused push acknowledges nothing) and wait until both run."""
    for task, failover in ((consistent, "absolute_consistency"), (other, "split_brain_allowed")):
        wait_for(
            lambda t=task, f=failover: push(c, to, repo, t, f, x).returncode == 0,
            within(10),
            f"{task} acknowledged by {to.name}",
        )
    wait_for(
        lambda: (x / f"{consistent}.starts").exists() and (x / f"{other}.starts").exists(),
        within(10),
        f"{consistent} and {other} run",
    )


def ack_branches(c: Cluster, n: NsNode, repo: str, *refs: str) -> None:
    """What n's branches hold now is acknowledged (pushes, and the agent's own commits)."""
    c.acked.setdefault(repo, set()).update(heads(n, repo, *refs))


# -- the checks every scenario makes ---------------------------------------------------
def majority_leads(c: Cluster, majority: list[int], minority: list[int]) -> tuple[str, int]:
    """One leader, on the majority side, that the whole majority agrees on; the minority
    reports none (it cannot vouch for any lease without a quorum)."""
    maj = [c.nodes[i] for i in majority]
    names = {n.name for n in maj}
    leader, term = wait_for(
        lambda: (a := agreed(maj, view_of)) and a[0] in names and a,
        within(15),
        "one leader agreed on the majority side",
    )
    for i in minority:
        st = wait_for(
            lambda i=i: (s := c.nodes[i].view())["status"] == "no-quorum" and s,
            within(TTL_S + HALT_SLACK_S),
            f"{c.nodes[i].name} sees it has no quorum",
        )
        assert st["leader"] is None
    assert set(leaders(c.nodes)) <= names
    return leader, term


def halts_in_time(n: NsNode, repo: str, task: str, cut_at: float) -> None:
    """The minority halts its consistent task (a `halted` commit on the branch, the run
    killed) within the lease TTL of the cut (wall clock, `time.time()` just before it),
    plus the stated slack. Timed by the halted commit's committer time, which the agent
    stamps as it writes it, so a slow poll here cannot fail the bound (whole seconds,
    rounded down: the bound holds to within one second)."""
    wait_for(
        lambda: "halted" in tip_message(n, repo, task),
        within(TTL_S + HALT_SLACK_S),
        f"{task} halted on {n.name}",
    )
    ref = f"refs/heads/task/{task}"
    at = int(git("log", "-1", "--format=%ct", ref, cwd=n.repo(repo)).stdout)
    took = at - cut_at
    print(f"{task} halted on {n.name} {took:.1f}s after the cut (bound {TTL_S + HALT_SLACK_S}s)")
    assert took <= TTL_S + HALT_SLACK_S, f"{task} halted {took:.1f}s after the cut"
    assert n.task(task)["state"] == "queued"


def one_owner_each(c: Cluster) -> dict[str, NsNode]:
    """Exactly one owner per repo: every node that knows the repo names the same owner
    and epoch, and only that node calls itself owner."""

    def owners() -> dict[str, NsNode] | None:
        seen: dict[str, set[tuple[str, int]]] = {}
        selves: dict[str, list[str]] = {}
        for n in c.nodes:
            for r in n.ctl("repo.describe"):
                if r.get("owner"):
                    seen.setdefault(r["repo"], set()).add((r["owner"], r["owner_epoch"]))
                if r["role"] == "owner":
                    selves.setdefault(r["repo"], []).append(n.name)
        if any(len(v) != 1 for v in seen.values()):
            return None
        by_name = {n.name: n for n in c.nodes}
        out = {}
        for repo, v in seen.items():
            ((owner, _),) = v
            if selves.get(repo) != [owner]:
                return None
            out[repo] = by_name[owner]
        return out

    return wait_for(owners, within(20), "exactly one owner per repo, agreed by every node")


def logs(c: Cluster, repo: str) -> str:
    """Every agent's log lines about `repo`, to tell a failure's story."""
    out = []
    for n in c.nodes:
        lines = [ln for ln in n.log().splitlines() if repo in ln]
        out.append(f"--- {n.name} ---\n" + "\n".join(lines[-40:]))
    spy = Path(sys.executable).with_name("py-spy")  # the bench extra's profiler, if there
    for n in c.nodes:  # where each agent's threads are (a stuck thread pool shows here)
        if spy.exists() and n.proc is not None:
            p = subprocess.run(
                [str(spy), "dump", "--pid", str(n.proc.pid)], capture_output=True, text=True
            )
            out.append(f"--- {n.name} threads ---\n{p.stdout[-6000:]}{p.stderr[-500:]}")
    return "\n".join(out)


def healed(c: Cluster) -> dict[str, NsNode]:
    """After the heal: one leader everywhere, one owner per repo, reconciliation done and
    no acknowledged commit lost, every task that must finish finishes (on its repo's
    owner), fsck clean. Returns the owner of each repo."""
    wait_for(lambda: agreed(c.nodes, view_of), within(20), "one leader after the heal")
    owner = one_owner_each(c)
    for repo, oids in sorted(c.acked.items()):
        o = owner[repo]

        def settled(o: NsNode = o, repo: str = repo, oids: set[str] = oids) -> bool:
            pending = git("for-each-ref", RECONCILE, cwd=o.repo(repo)).stdout.strip()
            return not pending and oids <= heads(o, repo)

        try:
            wait_for(settled, within(20), f"every acknowledged commit of {repo} on {o.name}")
        except AssertionError as e:
            missing = sorted(oids - heads(o, repo))
            pending = git("for-each-ref", RECONCILE, cwd=o.repo(repo)).stdout
            raise AssertionError(
                f"{e}\nmissing: {missing}\npending: {pending}\n{logs(c, repo)}"
            ) from e
    for repo, task in c.done:
        o = owner[repo]
        try:
            wait_for(
                lambda o=o, t=task: o.task(t)["state"] == "succeeded", within(20), f"{task} ends"
            )
        except AssertionError as e:
            raise AssertionError(f"{e}\n{o.task(task)}\n{logs(c, repo)}") from e
    # git fsck is not safe against a concurrent writer (a pack a fetch adds while it runs
    # is missed, and the new reflog entry reads as invalid): a real corruption persists,
    # so re-run until clean, reporting the last error at the deadline
    for n in c.nodes:
        for repo in (n.data / "repos").glob("*.git"):
            wait_for(lambda r=repo: fsck(r) is None, within(5), f"git fsck clean in {repo}")
    return owner


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("part")
    net = Net(N)
    nodes: list[NsNode] = []
    try:
        nodes += [NsNode(root, f"p{i}", net, i) for i in range(N)]
        nodes[0].start()
        for n in nodes[1:]:
            n.start("--join", gossip_addr(nodes[0]))
        try:
            wait_for(lambda: agreed(nodes, view_of), within(20), "one leader agreed by all five")
        except AssertionError as e:  # say why: each agent's coordination lines
            lines = [f"{n.name}: {ln}" for n in nodes for ln in n.log().splitlines()
                     if "kovanex.coordination" in ln]  # fmt: skip
            raise AssertionError(f"{e}\n" + "\n".join(lines[-60:])) from e
        # the lease's KV bucket grows to 5 replicas as servers join; cut before that, and a
        # 2 | 3 split can leave the majority without a quorum of the stream (ADR 0026), or
        # cost it writes if a new replica has not caught up yet (ADR 0045)
        wait_for(lambda: kv_replicated(nodes[0]), within(20), "the KV bucket current on all five")
        yield Cluster(net, nodes, root)
    finally:
        for n in nodes:
            n.stop()
        net.close()


@pytest.fixture(autouse=True)
def heal_after(cluster: Cluster):
    """A scenario that fails mid-partition must not leave the next one partitioned."""
    yield
    cluster.net.heal()


def taken(maj: list[NsNode], repo: str) -> NsNode | None:
    """The node every majority node names as `repo`'s owner, at a higher epoch (a split
    takeover at one epoch is settled first: the lower name keeps it)."""
    seen = set()
    for n in maj:
        rec = next((r for r in n.ctl("repo.describe") if r["repo"] == repo), {})
        seen.add((rec.get("owner"), rec.get("owner_epoch", 0)))
    if len(seen) != 1:
        return None
    ((name, epoch),) = seen
    return next((n for n in maj if n.name == name and epoch > 1), None)


def repo_named(prefix: str, owner: str, replica_in: set[str]) -> str:
    """A repo name whose replica (rendezvous-hashed on the name, so every node computes
    the same set) lands in `replica_in`: the scenario picks its path, not the leader draw."""
    members = [MemberView(f"p{i}") for i in range(N)]
    for k in range(1000):
        name = f"{prefix}{k}"
        if choose_replicas(owner, members, 1, salt=name)[0] in replica_in:
            return name
    raise AssertionError(f"no repo name puts {owner}'s replica in {replica_in}")


def test_split_2_3_with_the_leader_in_the_minority(cluster: Cluster) -> None:
    """Two async repos owned on the minority side: `bank`'s replica is on the minority
    too (its owner keeps it, and resumes the halted task), `fund`'s is on the majority
    (the majority takes it over; after the heal the old owner is deposed, its diverged
    tips are merged into the new owner's branches, and its tasks finish there)."""
    c, nodes = cluster, cluster.nodes
    leader, term = wait_for(lambda: agreed(nodes, view_of), within(10), "agreement")
    li = next(i for i, n in enumerate(nodes) if n.name == leader)
    other = next(i for i in range(N) if i != li)
    minority = [li, other]
    majority = [i for i in range(N) if i not in minority]
    owner = nodes[other]  # a minority node owns both repos and runs every task
    bank = repo_named("bank", owner.name, {leader})
    fund = repo_named("fund", owner.name, {nodes[i].name for i in majority})
    x = exchange_dir()
    for repo, pay, web in ((bank, "pay-1", "web-1"), (fund, "pay-f", "web-f")):
        owner.kx("repo", "create", repo)
        run_pair(c, owner, repo, pay, web, x)
        log = git("log", "--format=%B", f"refs/heads/task/{pay}", cwd=owner.repo(repo)).stdout
        assert "Kovanex-Term:" in log  # the consistent placement carries the leader term
    for repo, where in ((bank, {leader}), (fund, {nodes[i].name for i in majority})):

        def placed(r: str = repo, w: set[str] = where) -> bool:
            reps = owner.ctl("repo.status", name=r)["replicas"]
            return (
                bool(reps) and set(reps) <= w and all(v["refs_behind"] == 0 for v in reps.values())
            )

        wait_for(placed, within(10), f"{repo}'s replica in {sorted(where)}, caught up")
        ack_branches(c, owner, repo)

    cut_at = time.time()
    c.net.cut(*minority)
    new, new_term = majority_leads(c, majority, minority)
    assert new != leader and new_term > term
    for repo, pay in ((bank, "pay-1"), (fund, "pay-f")):
        halts_in_time(owner, repo, pay, cut_at)
    # an update of a consistent branch both sides hold is refused without a quorum (it
    # could never be merged after the heal)
    upd = c.root / "w-pay-1-update"
    git("clone", "-q", "-b", "task/pay-1", str(owner.repo(bank)), str(upd))
    git("commit", "-q", "--allow-empty", "-m", "an update", cwd=upd)
    p = owner.git_in_ns("push", "-q", str(owner.repo(bank)), "HEAD:refs/heads/task/pay-1", cwd=upd)
    assert p.returncode != 0 and "needs a quorum" in p.stderr, p.stderr
    # the majority takes over the repo whose replica it holds
    maj = [nodes[i] for i in majority]
    wait_for(lambda: taken(maj, fund), within(20), f"a majority node takes {fund} over")
    # ... and places no new consistent work
    for repo, pay in ((bank, "pay-2"), (fund, "pay-g")):
        assert push(c, owner, repo, pay, "absolute_consistency", x).returncode == 0
        wait_for(lambda p=pay: owner.task(p)["state"] == "queued", within(5), f"{pay} queued")
    # split_brain_allowed work goes on on the minority side
    for repo, web in ((bank, "web-1"), (fund, "web-f")):
        assert owner.task(web)["state"] == "running"
        ack_branches(c, owner, repo, f"refs/heads/task/{web}")
    for repo, pay in ((bank, "pay-2"), (fund, "pay-g")):
        assert not placements(owner, repo, pay) and owner.task(pay)["state"] == "queued"

    # the owner comes back first, so the leader has no reason to move `bank` (coming back
    # after its replica is the scenario below: the leader grants the repo at the heal)
    c.net.heal(other)
    wait_for(lambda: owner.name in members_of(nodes[majority[0]]), within(20), "owner back")
    c.net.heal()
    # one leader everywhere: the majority's, or a later one (a NATS stream-leader move at
    # the heal can cost it a renewal), never one from before the partition
    _, after = wait_for(lambda: agreed(nodes, view_of), within(20), "one leader")
    assert after >= new_term
    (x / "release").write_text("go")
    owners = one_owner_each(c)
    assert owners[fund] is not owner, f"{fund} stayed on {owner.name}"
    c.deposed.append((owner, fund, ("pay-f", "pay-g", "web-f")))
    # every task finishes on its repo's owner, before the next scenario cuts a node off
    c.done += [(fund, t) for t in ("pay-f", "pay-g", "web-f")]
    c.done += [(bank, t) for t in ("pay-1", "pay-2", "web-1")]
    if owners[bank] is not owner:  # the new leader may grant it to its replica at the heal
        c.deposed.append((owner, bank, ("pay-1", "pay-2", "web-1")))
        healed(c)
        return
    healed(c)
    # pay-1 ran its waiting step twice: before the halt, and resumed after the heal
    assert len((x / "pay-1.starts").read_text().split()) == 2
    assert [s["state"] for s in owner.task("pay-1")["steps"]] == ["ok", "ok"]


def test_a_repo_granted_to_its_replica_as_the_partition_heals(cluster: Cluster) -> None:
    """The leader and the owner of a repo whose only replica is the leader are cut off.
    The old leader comes back first; while the owner still looks gone, the new leader
    grants the repo to it. When the owner is back: its run of the split_brain_allowed
    task is handed to the new owner and placed again, the consistent task it halted is
    placed again at the new term, and both finish there. Each of those three steps hung
    before (ADR 0045: the lease term read after the heal, a placement refused for an
    older term kept queued, a demoted owner's runs handed over)."""
    c, nodes = cluster, cluster.nodes
    leader, _ = wait_for(lambda: agreed(nodes, view_of), within(10), "agreement")
    li = next(i for i, n in enumerate(nodes) if n.name == leader)
    oi = next(i for i in range(N) if i != li)
    majority = [i for i in range(N) if i not in (li, oi)]
    owner, old_leader = nodes[oi], nodes[li]
    repo = repo_named("ledger", owner.name, {leader})
    x = exchange_dir()
    owner.kx("repo", "create", repo)
    run_pair(c, owner, repo, "pay-h", "web-h", x)

    def placed() -> bool:
        reps = owner.ctl("repo.status", name=repo)["replicas"]
        return set(reps) == {leader} and all(v["refs_behind"] == 0 for v in reps.values())

    wait_for(placed, within(10), f"{repo}'s replica on {leader}, caught up")
    ack_branches(c, owner, repo)
    cut_at = time.time()
    c.net.cut(li, oi)
    majority_leads(c, majority, [li, oi])
    halts_in_time(owner, repo, "pay-h", cut_at)
    ack_branches(c, owner, repo, "refs/heads/task/web-h")
    c.net.heal(li)

    def granted() -> bool:
        rec = next((r for r in old_leader.ctl("repo.describe") if r["repo"] == repo), {})
        return rec.get("owner") == leader and rec.get("role") == "owner"

    wait_for(granted, within(30), f"{repo} granted to {leader} while {owner.name} is away")
    c.net.heal()
    (x / "release").write_text("go")
    assert one_owner_each(c)[repo] is old_leader
    c.deposed.append((owner, repo, ("pay-h", "web-h")))
    c.done += [(repo, "pay-h"), (repo, "web-h")]
    healed(c)


def test_the_owner_of_a_sync_repo_isolated(cluster: Cluster) -> None:
    c, nodes = cluster, cluster.nodes
    leader, term = wait_for(lambda: agreed(nodes, view_of), within(10), "agreement")
    oi = next(i for i, n in enumerate(nodes) if n.name != leader)
    owner = nodes[oi]
    majority = [i for i in range(N) if i != oi]
    x = exchange_dir()
    owner.kx("repo", "create", "vault")
    owner.kx("repo", "replication", "vault", "sync", "--replicas", "2")
    # a sync push is refused until two replicas hold the repo: place them, then push (a
    # refused push acknowledges nothing, so a client may simply retry it)
    wait_for(
        lambda: len(owner.ctl("repo.status", name="vault")["replicas"]) == 2,
        within(10),
        "two replicas placed",
    )
    run_pair(c, owner, "vault", "pay-v", "web-v", x)

    def caught_up() -> bool:
        reps = owner.ctl("repo.status", name="vault")["replicas"]
        return len(reps) == 2 and all(v["refs_behind"] == 0 for v in reps.values())

    wait_for(caught_up, within(10), "both replicas hold every ref")
    ack_branches(c, owner, "vault")

    cut_at = time.time()
    c.net.cut(oi)
    # the isolated owner refuses pushes: nothing acknowledged, nothing moved
    refused = push(c, owner, "vault", "pay-late", "split_brain_allowed", x)
    assert refused.returncode != 0 and "sync replication" in refused.stderr, refused.stderr
    assert (
        git(
            "rev-parse",
            "-q",
            "--verify",
            "refs/heads/task/pay-late",
            cwd=owner.repo("vault"),
            check=False,
        ).returncode
        != 0
    )
    # one leader on the majority side: usually the one before the cut, but a new one if the
    # isolated node led the lease's KV stream (NATS's re-election outlasts the TTL, ADR 0026)
    majority_leads(c, majority, [oi])
    halts_in_time(owner, "vault", "pay-v", cut_at)
    # the majority takes the repo over at a higher epoch and accepts pushes
    maj = [nodes[i] for i in majority]

    new = wait_for(lambda: taken(maj, "vault"), within(20), "a majority node takes vault over")
    # (acknowledged once it has two replicas again; its consistent work is placed)
    run_pair(c, new, "vault", "pay-m", "web-m", x)
    # the minority: split_brain_allowed work runs on, the halted task is not placed again
    assert owner.task("web-v")["state"] == "running"
    assert owner.task("pay-v")["state"] == "queued"
    assert len((x / "pay-v.starts").read_text().split()) == 1
    ack_branches(c, new, "vault")
    ack_branches(c, owner, "vault", "refs/heads/task/web-v")

    c.net.heal()
    (x / "release").write_text("go")
    c.deposed.append((owner, "vault", ("pay-v", "web-v")))
    c.done += [("vault", t) for t in ("pay-m", "web-m", "pay-v", "web-v")]
    healed(c)


def test_a_deposed_owner_places_no_consistent_work_and_its_tasks_finish(
    cluster: Cluster,
) -> None:
    if not cluster.deposed:
        pytest.skip("no scenario deposed an owner")
    owners = one_owner_each(cluster)
    for old, repo, tasks in cluster.deposed:
        new = owners[repo]
        lost = git("for-each-ref", "--format=%(refname)", "refs/kovanex/lost/", cwd=old.repo(repo))
        for task in tasks:
            stale = placements(old, repo, task, *lost.stdout.split()) - placements(new, repo, task)
            assert not stale, f"{old.name} placed {task} under a deposed ownership: {stale}"
        for task in tasks:
            state = wait_for(
                lambda n=new, t=task: (s := n.task(t)["state"]) in FINAL and s,
                within(20),
                f"{task} final",
            )
            assert state == "succeeded", f"{repo}/{task} ended {state} on {new.name}"


def test_a_flapping_link_never_makes_two_leaders(cluster: Cluster) -> None:
    c, nodes = cluster, cluster.nodes
    leader, term = wait_for(lambda: agreed(nodes, view_of), within(10), "agreement")
    flapper = next(i for i, n in enumerate(nodes) if n.name == leader)
    rest = [i for i in range(N) if i != flapper]
    held: dict[int, set[str]] = {}  # term -> every node seen leading it

    def watch() -> dict[str, int]:
        now = leaders(nodes)
        for name, t in now.items():
            held.setdefault(t, set()).add(name)
        return now

    for _ in range(3):
        c.net.cut(flapper)
        wait_for(
            lambda: (watch() or True) and nodes[flapper].view()["leader"] is None,
            within(TTL_S + HALT_SLACK_S),
            "the cut-off node stops reporting a leader",
        )
        majority_leads(c, rest, [flapper])
        c.net.heal(flapper)
        wait_for(lambda: len(watch()) == 1, within(15), "one leader after the flap")
    _, final_term = wait_for(lambda: agreed(nodes, view_of), within(20), "agreement")
    assert final_term > term
    assert all(len(v) == 1 for v in held.values()), f"a term with two leaders: {held}"
    healed(c)
