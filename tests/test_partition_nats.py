"""Issue 12 part 5: real partitions between real agents (each with its nats-server child),
one network namespace per node on a bridge, links cut by bringing a veth down.

One 5-node cluster serves the scenarios in order (starting it is the slow part):
- split 2 | 3 with the leader on the minority side (so the leader is isolated from the
  quorum too): one leader, on the majority side, at a higher term; the minority halts its
  absolute_consistency task and places none, while split_brain_allowed work goes on; after
  the heal one leader everywhere, the halted task resumes and succeeds, git fsck is clean;
- a flapping link: a follower's link goes down and up several times; never two leaders
  at once, and one agreed leader afterwards.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.agentkit import Node, exchange_dir, fsck, git, wait_for
from tests.netnskit import Net, skip_reason
from tests.test_coordination_nats import agreed, gossip_addr, status

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or ""),
]
TOKEN = "t0ken-for-partition-tests"
N = 5


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
        subprocess.run(cmd, check=True, capture_output=True)

    def kx(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [*self.prefix, sys.executable, "-m", "kovanex", *args, "--data", str(self.data)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if check and p.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
            )
        return p


def leaders(nodes: list[Node]) -> set[str]:
    """Nodes that call themselves leader right now."""
    out = set()
    for n in nodes:
        st = status(n)
        out |= {r["id"] for r in st["nodes"] if r["role"] == "leader" and r["id"] == n.name}
    return out


def tip_message(n: Node, repo: str, task: str) -> str:
    return git("log", "-1", "--format=%B", f"refs/heads/task/{task}", cwd=n.repo(repo)).stdout


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


def push(n: Node, repo: str, task: str, failover: str, x: Path, tmp: Path) -> None:
    work = tmp / f"w-{task}"
    git("init", "-q", str(work))
    (work / ".kovanex").mkdir()
    spec = SPEC.format(failover=failover, node=n.name, x=x, task=task)
    (work / ".kovanex" / "task.toml").write_text(spec)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", task, cwd=work)
    git("push", "-q", str(n.repo(repo)), f"HEAD:refs/heads/task/{task}", cwd=work)


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
        wait_for(lambda: agreed(nodes), 90, "one leader agreed by all five nodes")
        yield net, nodes, root
    finally:
        for n in nodes:
            n.stop()
        net.close()


def test_split_2_3_with_the_leader_in_the_minority(cluster) -> None:
    net, nodes, root = cluster
    leader, term = wait_for(lambda: agreed(nodes), 60, "agreement")
    li = next(i for i, n in enumerate(nodes) if n.name == leader)
    other = next(i for i in range(N) if i != li)
    minority = [li, other]
    majority = [i for i in range(N) if i not in minority]
    owner = nodes[other]  # a minority node owns the repo and runs both tasks
    x = exchange_dir()
    owner.kx("repo", "create", "bank")
    push(owner, "bank", "pay-1", "absolute_consistency", x, root)
    push(owner, "bank", "web-1", "split_brain_allowed", x, root)
    wait_for(lambda: (x / "pay-1.starts").exists() and (x / "web-1.starts").exists(), 60, "runs")
    assert (
        "Kovanex-Term:"
        in git("log", "--format=%B", "refs/heads/task/pay-1", cwd=owner.repo("bank")).stdout
    )  # the consistent placement carries the leader term

    net.cut(*minority)
    maj = [nodes[i] for i in majority]
    new, new_term = wait_for(
        lambda: (a := agreed(maj)) and a[0] != leader and a, 60, "a majority-side leader"
    )
    assert new in {n.name for n in maj} and new_term > term
    # the minority halts its consistent task (a halted commit on the branch, run killed)
    wait_for(lambda: "halted" in tip_message(owner, "bank", "pay-1"), 30, "pay-1 halted")
    # ... places no new consistent work, and says it has no quorum
    push(owner, "bank", "pay-2", "absolute_consistency", x, root)
    for i in minority:
        st = wait_for(lambda i=i: (s := status(nodes[i]))["status"] == "no-quorum" and s, 30)
        assert st["leader"] is None
    assert owner.show("pay-2")["state"] == "queued"
    # split_brain_allowed work goes on on the minority side
    assert owner.show("web-1")["state"] == "running"
    assert leaders(maj) == {new}

    net.heal()
    wait_for(lambda: (a := agreed(nodes)) and a[0] == new, 90, "one leader after the heal")
    (x / "release").write_text("go")
    for task in ("pay-1", "pay-2", "web-1"):
        wait_for(lambda t=task: owner.show(t)["state"] == "succeeded", 90, f"{task} succeeds")
    # pay-1 ran its waiting step twice: before the halt, and resumed after the heal
    assert len((x / "pay-1.starts").read_text().split()) == 2
    steps = [s["state"] for s in owner.show("pay-1")["steps"]]
    assert steps == ["ok", "ok"]
    for n in nodes:
        for repo in (n.data / "repos").glob("*.git"):
            fsck(repo)


def test_a_flapping_link_never_makes_two_leaders(cluster) -> None:
    net, nodes, _ = cluster
    wait_for(lambda: agreed(nodes), 90, "agreement")
    leader, term = agreed(nodes) or ("", 0)
    flapper = next(i for i, n in enumerate(nodes) if n.name == leader)
    for _ in range(3):
        net.cut(flapper)
        wait_for(lambda: len(leaders(nodes)) <= 1 and status(nodes[flapper])["leader"] is None, 30)
        net.heal(flapper)
        wait_for(lambda: len(leaders(nodes)) == 1, 60, "one leader after the flap")
    final, final_term = wait_for(lambda: agreed(nodes), 90, "agreement after flapping")
    assert final_term >= term
