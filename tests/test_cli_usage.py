"""Issue 27 (CLI) without an agent: a wrong --data says so, hints name flags the verb
has, and a subcommand's mistake is answered with the subcommand's own usage."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.agentkit import kx

# every verb that reads or asks this node, as a new user would first type it
VERBS = [
    ("task", "list"),
    ("task", "show", "t1"),
    ("task", "logs", "t1"),
    ("task", "cancel", "t1"),
    ("task", "retry", "t1"),
    ("task", "wait", "t1"),
    ("task", "archive", "--older-than", "0s"),
    ("repo", "list"),
    ("repo", "status", "r"),
    ("units",),
    ("keys", "--list"),
    ("token", "list"),
    ("status",),
    ("members",),
    ("graph",),
    ("health",),
    ("api", "ListNodes"),
    ("env", "list"),
    ("node", "cordon", "n1"),
]


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_a_missing_data_dir_says_so_for_every_verb(tmp_path: Path, verb: tuple[str, ...]) -> None:
    gone = tmp_path / "no" / "such"
    p = kx(*verb, data=gone, check=False)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stdout == ""  # no empty table that reads as "no tasks"
    assert f"kovanex: no node at {gone} " in p.stderr, p.stderr
    assert "run `kovanex init --data" in p.stderr and "Traceback" not in p.stderr
    assert not gone.exists()  # and nothing was made there (`keys` used to)


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_hints_name_only_flags_the_verb_takes(tmp_path: Path, verb: tuple[str, ...]) -> None:
    """Each --flag a hint suggests for this verb (outside a `quoted command`) is one the
    verb's own --help lists."""
    err = re.sub(r"`[^`]*`", "", kx(*verb, data=tmp_path / "none", check=False).stderr)
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", err)) - {"--data"}
    if not named:
        return
    words = [w for w in verb if not w.startswith("-")][:2]
    if words[0] not in ("task", "repo", "token", "node", "env"):
        words = words[:1]
    usage = kx(*words, "--help").stdout
    for flag in named:
        assert flag in usage, f"{' '.join(verb)}: the hint names {flag}, its --help lacks it"


def test_verbs_that_only_ask_an_agent_take_addr() -> None:
    for words in (["status"], ["members"], ["graph"], ["api", "X"], ["node", "cordon", "x"],
                  ["repo", "replication", "r", "none"], ["cluster", "status"]):  # fmt: skip
        help_words = [w for w in words if w[0].islower() and w not in ("x", "r", "none", "X")]
        assert "--addr" in kx(*help_words, "--help").stdout, words


@pytest.mark.parametrize(
    "argv, usage",
    [
        (("task", "list", "--bogus"), "usage: kovanex task list "),
        (("repo", "replication", "r", "none", "--zz"), "usage: kovanex repo replication "),
        (("members", "extra"), "usage: kovanex members "),
        (("node", "cordon", "n1", "n2"), "usage: kovanex node cordon "),
    ],
)
def test_an_unknown_argument_prints_the_subcommand_usage(
    tmp_path: Path, argv: tuple[str, ...], usage: str
) -> None:
    p = kx(*argv, data=tmp_path, check=False)
    assert p.returncode == 2
    assert p.stderr.startswith(usage), p.stderr
    prog = usage.removeprefix("usage: ").strip()
    assert f"{prog}: error: unrecognized arguments: {argv[-1]}" in p.stderr
