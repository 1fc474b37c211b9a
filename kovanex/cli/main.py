"""Entry point: `kovanex [--data DIR] <verb> ...`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from kovanex import __version__
from kovanex import config as cfgmod
from kovanex.cli.output import CliError

# Which module registers each top-level command, in `--help` order. Only the chosen
# command's module is imported (ADR 0044): `kovanex task list` must not load the agent's
# client, asyncio or the runner. tests/test_cli_start.py checks this against the modules.
COMMANDS: dict[str, str] = {
    **dict.fromkeys(("init", "agent", "status"), "nodecmd"),
    "repo": "repocmd",
    "task": "taskcmd",
    "schema": "schemacmd",
    **dict.fromkeys(("members", "join", "leave", "force-leave", "monitor"), "clustercmd"),
    **dict.fromkeys(("keygen", "keys", "cluster", "node"), "clustercmd"),
    **dict.fromkeys(("health", "graph", "module"), "schedcmd"),
    "units": "unitcmd",
    **dict.fromkeys(("token", "credential"), "tokencmd"),
    "api": "apicmd",
    "scale": "scalecmd",
    **dict.fromkeys(("env", "promote", "approve", "verify", "rollback"), "envcmd"),
}


def _modules(rest: list[str] | None) -> list[str]:
    """The command modules a command line needs: the chosen command's; none for a bare
    `--version`; every one for `--help` or a word that is no command (argparse then
    lists them all)."""
    word = next((a for a in rest if not a.startswith("-")), None) if rest is not None else None
    if word in COMMANDS:
        return [COMMANDS[word]]
    if rest is not None and word is None and not {"-h", "--help"} & set(rest):
        return []
    return list(dict.fromkeys(COMMANDS.values()))


def build_parser(rest: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `rest` (the command line without `--data`); every command's when
    `rest` is None."""
    p = argparse.ArgumentParser(
        prog="kovanex", description="Kovanex: a git-native task engine. A task is a branch."
    )
    p.add_argument("--version", action="version", version=f"kovanex {__version__}")
    p.add_argument(
        "--data", default=None, help="node data dir (default: $KOVANEX_HOME, then ~/.kovanex)"
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="<command>")
    for name in _modules(rest):
        importlib.import_module(f"kovanex.cli.{name}").register(sub)
    return p


def split_data(argv: list[str]) -> tuple[str | None, list[str]]:
    """`--data DIR` may stand anywhere on the line (`kovanex repo create x --data d`)."""
    data, rest, i = None, [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--data" and i + 1 < len(argv):
            data, i = argv[i + 1], i + 2
            continue
        if a.startswith("--data="):
            data = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    return data, rest


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """The deepest subcommand parser `args` went through (`kovanex task list`'s), so a
    mistake in its arguments is answered with its own usage, not the top-level one."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, sub.dest, None) if sub is not None else None
        if sub is None or name not in sub.choices:
            return parser
        parser = sub.choices[name]


def parse(rest: list[str]) -> argparse.Namespace:
    parser = build_parser(rest)
    args, extra = parser.parse_known_args(rest)
    if extra:  # argparse would print the top-level usage: say it as the verb's own parser
        chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def check_node(args: argparse.Namespace, layout: cfgmod.Layout) -> None:
    """A verb that needs a node refuses a data dir that holds none, before it reads
    anything (an empty table would say "no tasks", not "wrong --data"). A verb that takes
    `--addr` needs no local node once it is pointed at an agent."""
    takes_addr = hasattr(args, "addr")
    if not getattr(args, "needs_node", True) or layout.config.exists():
        return
    if takes_addr and (args.addr or os.environ.get("KOVANEX_ADDR")):
        return
    raise CliError(cfgmod.no_node(layout, addr_hint=takes_addr))


def main(argv: list[str] | None = None) -> int:
    data, rest = split_data(list(sys.argv[1:] if argv is None else argv))
    args = parse(rest)
    layout = cfgmod.Layout(cfgmod.data_dir(data))
    try:
        check_node(args, layout)
        rc = int(args.func(args, layout) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
        return rc
    except (CliError, cfgmod.ConfigError) as e:
        print(f"kovanex: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_left()


SIGPIPE_STATUS = 141  # what git and a shell report for a writer whose reader left (128 + 13)


def _reader_left() -> int:
    """`kovanex task list | head`: the reader has what it wanted; leave without a word.

    Python would flush stdout again at exit and print a second BrokenPipeError, so stdout
    is pointed at /dev/null first (the recipe in the `signal` module's documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return SIGPIPE_STATUS


if __name__ == "__main__":
    sys.exit(main())
