"""Environments and promotions in git: read them into the decider's `Repo`, write its notes.

`env/<name>` is first-parent only, one release commit per promotion, whose tree is the
freight's tree (check it out and you have the release) and whose trailers say what was
verified. `promotion/<env>/<version>` commits have the empty tree: they are a log. The
release commit is never a child of the freight, so `git log env/prod` is the release
history and nothing else (ADR 0021).
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pygit2

from kovanex import envspec
from kovanex.core import promotion_state as ps
from kovanex.gitstate import refs, trailers
from kovanex.gitstate.pygit2store import Pygit2Store
from kovanex.gitstate.store import EMPTY_TREE
from kovanex.spec import SPEC_PATH, SpecError
from kovanex.tomlwrite import toml_quote, toml_value

T_OWNER_EPOCH = "Kovanex-Owner-Epoch"
T_TERM = "Kovanex-Term"  # the leader's term, when coordination is on (ADR 0021, 0026)


def config_commit(store: Pygit2Store) -> str | None:
    """The default branch's tip: environments.toml is read there (not from the freight).
    HEAD first; a bare repo's HEAD may name an unborn `master` while users push `main`."""
    for name in ("HEAD", refs.HEADS + "main", refs.HEADS + "master"):
        tip = store.get_ref(name)
        if tip is not None:
            return tip
    return None


def read_graph(store: Pygit2Store) -> tuple[ps.Graph | None, list[SpecError], str | None]:
    tip = config_commit(store)
    if tip is None:
        return None, [], None
    data = store.read_file(tip, envspec.ENV_PATH)
    if data is None:
        return None, [], tip
    graph, errs = envspec.parse(data, lambda p: store.read_file(tip, p))
    return graph, errs, tip


def _float(t: dict[str, str], key: str) -> float:
    try:
        return float(t.get(key, "0"))
    except ValueError:
        return 0.0


def read_history(store: Pygit2Store, env: str, limit: int = 200) -> tuple[ps.Release, ...]:
    tip = store.get_ref(refs.env_ref(env))
    if tip is None:
        return ()
    out = []
    for c in store.walk(tip, limit):
        t = trailers.trailer_dict(c.message)
        if t.get(ps.T_ENV) != env:
            continue
        out.append(
            ps.Release(
                env=env,
                version=t.get(ps.T_VERSION, ""),
                freight=t.get(ps.T_FREIGHT, ""),
                commit=c.oid,
                promotion=t.get(ps.T_PROMOTION, ""),
                attempt=int(t.get(ps.T_ATTEMPT, "1") or 1),
                born=_float(t, ps.T_BORN),
                at=_float(t, ps.T_TIME),
                rollback_of=t.get(ps.T_ROLLBACK_OF, ""),
            )
        )
    return tuple(out)


def owner_epoch_of(store: Pygit2Store, env: str) -> int:
    return _tip_number(store, env, T_OWNER_EPOCH)


def term_of(store: Pygit2Store, env: str) -> int:
    """The leader term the env's newest release was moved under (0: none)."""
    return _tip_number(store, env, T_TERM)


def _tip_number(store: Pygit2Store, env: str, key: str) -> int:
    tip = store.get_ref(refs.env_ref(env))
    if tip is None:
        return 0
    return int(trailers.trailer_dict(store.read_commit(tip).message).get(key, "0") or 0)


def read_promotions(store: Pygit2Store) -> dict[str, ps.Promotion]:
    out: dict[str, ps.Promotion] = {}
    for ref, tip in store.refs(refs.PROMOTION_PREFIX).items():
        env, _, version = ref[len(refs.PROMOTION_PREFIX) :].partition("/")
        if not version or "/" in version:
            continue
        commits = [(c.oid, trailers.parse_trailers(c.message)) for c in store.walk(tip)]
        commits.reverse()
        out[ps.promotion_id(env, version)] = ps.fold(env, version, commits)
    return out


def notes_of(store: Pygit2Store, env: str, version: str) -> list[tuple[str, str]]:
    """(oid, subject) of a promotion's commits, oldest first: the report lines."""
    tip = store.get_ref(refs.promotion_ref(env, version))
    if tip is None:
        return []
    out = [(c.oid, trailers.subject(c.message)) for c in store.walk(tip)]
    out.reverse()
    return out


def read_releases(store: Pygit2Store, graph: ps.Graph) -> dict[str, tuple[str, str]]:
    """version -> (freight commit, who pushed it) for release tags and promote/ refs."""
    out: dict[str, tuple[str, str]] = {}
    for prefix in (refs.TAG_PREFIX, refs.PROMOTE_PREFIX):
        for ref in store.refs(prefix) if prefix != refs.TAG_PREFIX else _tags(store):
            version = refs.release_version_of(ref)
            if version is None or (prefix == refs.TAG_PREFIX and not graph.is_release(version)):
                continue
            freight = peel(store, ref)
            if freight is not None:
                out.setdefault(version, (freight, store.pusher(ref, _target(store, ref)) or ""))
    return out


def _tags(store: Pygit2Store) -> list[str]:
    return [r for r in store.repo.references if r.startswith(refs.TAG_PREFIX)]


def _target(store: Pygit2Store, ref: str) -> str:
    r = store.repo.references.get(ref)
    return str(r.target) if r is not None else ""


def peel(store: Pygit2Store, ref: str) -> str | None:
    """The commit a (possibly annotated) tag or branch names."""
    try:
        obj = store.repo.revparse_single(ref).peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError):
        return None
    return str(obj.id)


# -- writes -------------------------------------------------------------------------------
def note_commits(
    store: Pygit2Store, rec: ps.Record, author: tuple[str, str], now: float
) -> str | None:
    """Chain `rec`'s notes on its expected tip; returns the new tip (the ref is not moved)."""
    tip = rec.expected
    pid = ps.promotion_id(rec.env, rec.version)
    for note in rec.notes:
        trs = list(note.trailers)
        if not any(k == ps.T_PROMOTION for k, _ in trs):
            trs.insert(0, (ps.T_PROMOTION, pid))
        if note.status:
            trs.append((ps.T_STATUS, note.status))
        msg = trailers.build_message(note.subject, trs)
        tip = store.create_commit(EMPTY_TREE, [tip] if tip else [], msg, author, int(now))
    return tip


def env_commit(
    store: Pygit2Store,
    move: ps.MoveEnv,
    author: tuple[str, str],
    epoch: int,
    now: float,
    term: int = 0,
) -> str:
    tree = store.read_commit(move.freight).tree
    trs = [*move.trailers, (T_OWNER_EPOCH, str(epoch))]
    if term:
        trs.append((T_TERM, str(term)))
    what = "rollback to" if any(k == ps.T_ROLLBACK_OF for k, _ in trs) else "release"
    msg = trailers.build_message(f"{what} {move.version} into {move.env}", trs)
    parents = [move.expected_env] if move.expected_env else []
    return store.create_commit(tree, parents, msg, author, int(now))


def gate_spec(env: ps.EnvDef, start: ps.StartTask, read: Any) -> bytes:
    """The gate's task spec, placed by the environment's label: the inline command as one
    step, or the named spec file with the label added to its placement."""
    g = start.gate
    doc: dict[str, Any]
    if g.spec is not None:
        doc = tomllib.loads((read(g.spec) or b"").decode())
    else:
        doc = {"steps": [{"name": g.name, "run": g.run, "timeout_s": g.timeout_s}]}
    doc.setdefault("description", f"{start.role} {g.name} for {start.version} → {start.env}")
    placement = doc.setdefault("placement", {})
    placement.setdefault("labels", {})[env.label[0]] = env.label[1]
    return toml_dumps(doc).encode()


def task_commit(
    store: Pygit2Store, start: ps.StartTask, spec: bytes, author: tuple[str, str]
) -> str:
    """A gate task branch: the freight's tree with the gate's spec, on top of the freight."""
    tree = store.tree_with(store.read_commit(start.freight).tree, {SPEC_PATH: spec})
    msg = trailers.build_message(
        f"{start.role} {start.gate.name} for {start.version} → {start.env}",
        [
            (ps.T_PROMOTION, ps.promotion_id(start.env, start.version)),
            (ps.T_FREIGHT, start.freight),
            ("Kovanex-Gate-Def", start.gate.def_sha),
        ],
    )
    return store.create_commit(tree, [start.freight], msg, author)


def toml_dumps(doc: dict[str, Any], top: bool = True) -> str:
    """Enough TOML for a task spec: scalars, lists and inline tables, and at the top level
    tables (`[placement]`) and arrays of tables (`[[steps]]`)."""
    tables = {k for k, v in doc.items() if top and isinstance(v, dict)}
    arrays = {k for k, v in doc.items() if top and _is_table_list(v)}
    lines = [f"{_key(k)} = {toml_value(v)}" for k, v in doc.items() if k not in tables | arrays]
    for k in tables:
        lines += ["", f"[{_key(k)}]", *toml_dumps(doc[k], False).splitlines()]
    for k in arrays:
        for item in doc[k]:
            lines += ["", f"[[{_key(k)}]]", *toml_dumps(item, False).splitlines()]
    return "\n".join(lines) + "\n"


def _is_table_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else toml_quote(k)
