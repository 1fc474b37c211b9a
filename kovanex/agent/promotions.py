"""The promotion service: reads environments and promotions from git, asks the pure
decider (kovanex/core/promotion.py) what happens next, and carries it out.

It runs on the repo's owner only, and every write is a CAS on the tip the decision was made
on: a note on `promotion/<env>/<version>`, a gate task branch (created, never moved), or a
release commit on `env/<name>` moved together with its promotion in one atomic
`update-ref` transaction. Release commits carry the owner's epoch; a writer whose epoch is
older than the one on the env's tip stands down (ADR 0021). No lock is held across I/O that
could block on the network: everything here is local git.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any, cast

from kovanex.agent.context import NodeContext
from kovanex.agent.control import ControlError
from kovanex.agent.replication.manager import ReplicaManager
from kovanex.agent.repos import RepoIndex
from kovanex.core import promotion as pcore
from kovanex.core import promotion_state as ps
from kovanex.gitstate import gitcli, refs, releases
from kovanex.gitstate.ledger import NoSuchTask
from kovanex.gitstate.pygit2store import Pygit2Store
from kovanex.gitstate.store import CasConflict
from kovanex.pushcheck import ZERO, RefUpdate, queue_submission

log = logging.getLogger("kovanex.promotions")
TICK_S = float(os.environ.get("KOVANEX_PROMOTE_TICK_S", "0.5"))
# How long a push waits, streaming the report, before it prints how to follow instead.
FOLLOW_S = float(os.environ.get("KOVANEX_PROMOTE_FOLLOW_S", "20"))
GATE_PRIORITY = 70  # gates go before ordinary work: a release is waiting on them
QUIET = ("gate ", "gates passed; queued", "approved; queued")


class PromotionRefused(ControlError):
    """The decider's refusal, with its code (unknown_env, not_waiting, self_approval...)."""

    def __init__(self, reason: str, code: str = "refused") -> None:
        super().__init__(reason)
        self.code = code


def change_of(repo: str, state: ps.Repo, eff: ps.Record | ps.MoveEnv) -> dict[str, Any]:
    """The `promotion` event for a note or a release just written: what changed, and the
    promotion's state after it (a note without a status keeps the one it had)."""
    rec = eff.record if isinstance(eff, ps.MoveEnv) else eff
    pid = pcore.promotion_id(rec.env, rec.version)
    before = state.promotions.get(pid)
    status = next((n.status for n in reversed(rec.notes) if n.status), "")
    status = status or (before.status if before else "")
    keys = {k for n in rec.notes for k, _ in n.trailers}
    if isinstance(eff, ps.MoveEnv):
        what = "rolled_back" if any(k == ps.T_ROLLBACK_OF for k, _ in eff.trailers) else "moved"
    elif ps.T_SUPERSEDED in keys:
        what = "superseded"
    elif ps.T_APPROVED in keys:
        what = "approved"
    elif ps.T_GATE in keys:
        what = "gate"
    elif before is None:
        what = "opened"
    else:
        what = status or "noted"
    message = rec.notes[-1].subject if rec.notes else ""
    return {"repo": repo, "env": rec.env, "version": rec.version, "id": pid, "state": status,
            "event": what, "message": message}  # fmt: skip


def gate_rows(p: ps.Promotion, tasks: dict[str, str]) -> list[dict[str, str]]:
    """This attempt's verdict on each gate (the newest: `passed` replaces `started`), with
    its gate task and the task's state now."""
    newest = {v.gate: v for v in p.verdicts if v.attempt == p.attempt}
    return [
        {"gate": v.gate, "result": v.result, "task": v.task, "state": tasks.get(v.task, "")}
        for v in newest.values()
    ]


def report_line(env: str, subject: str) -> str | None:
    """A promotion note as the pusher sees it (the seed's shape), None for bookkeeping."""
    if subject.startswith(QUIET):
        return None
    return subject if subject.startswith(("promote", "verify", "roll back")) else f"  {subject}"


class Promotions:
    def __init__(
        self,
        ctx: NodeContext,
        repos: RepoIndex,
        replicas: ReplicaManager,
        changed: Callable[[str, str | None], None],
        members: Callable[[], list[dict[str, Any]]],
        *,
        term: Callable[[], int | None] = lambda: 0,
        on_change: Callable[[dict[str, Any]], None] = lambda event: None,
    ) -> None:
        self.ctx = ctx
        self.repos = repos
        self.replicas = replicas
        self.changed = changed  # the dispatcher: schedule a task / announce moved refs
        # the leader's term when coordination is on (None: no quorum), 0 on gossip
        self.term = term
        self.members = members
        self.on_change = on_change  # the API's feed
        self.seen: dict[tuple[str, str], float] = {}  # (repo, version) -> first seen
        self.errors: dict[str, list[str]] = {}
        self.busy: dict[str, int] = {}  # repo -> effects applied by its last pass
        self._kick = asyncio.Event()
        self._passed = asyncio.Condition()
        self._lock = asyncio.Lock()  # one pass per agent: decisions read what the last wrote

    # -- the loop ---------------------------------------------------------------------
    def kick(self, repo: str = "") -> None:
        self._kick.set()

    async def run(self) -> None:
        while True:
            try:
                await self.ctx.clock.wait_for(self._kick.wait(), TICK_S)
            except TimeoutError:
                pass
            self._kick.clear()
            for repo in self.repos.owned():
                try:
                    await self.tick(repo)
                except Exception:
                    log.exception("promotion pass over %s failed", repo)
            async with self._passed:
                self._passed.notify_all()

    async def tick(self, repo: str) -> int:
        async with self._lock:
            state = self.gather(repo)
            if state is None:
                return 0
            now = self.ctx.clock.time()
            done = 0
            for eff in pcore.tick(state, now):
                done += await self._apply(repo, state, eff, now)
            self.busy[repo] = done
        if done:
            self._kick.set()  # what was just written may decide the next step
        return done

    # -- reading ----------------------------------------------------------------------
    def _store(self, repo: str) -> Pygit2Store:
        """The repo's store as the ledger holds it (RepoIndex opens every repo with pygit2)."""
        return cast(Pygit2Store, self.repos.ledger(repo).store)

    def gather(self, repo: str) -> ps.Repo | None:
        ledger = self.repos.ledger(repo)
        store = self._store(repo)
        graph, errs, _ = releases.read_graph(store)
        if errs:
            self.errors[repo] = [str(e) for e in errs]
        else:
            self.errors.pop(repo, None)
        if graph is None:
            return None
        history = {e.name: releases.read_history(store, e.name) for e in graph.envs}
        promos = releases.read_promotions(store)
        wanted = [v.task for p in promos.values() for v in p.verdicts if v.attempt == p.attempt]
        wanted += [p.deploy for p in promos.values() if p.deploy]
        tasks: dict[str, str] = {}
        for tid in wanted:
            try:
                tasks[tid] = ledger.read(tid).state
            except (NoSuchTask, ValueError):
                pass
        now = self.ctx.clock.time()
        rels = {
            version: (
                freight,
                by or f"local@{self.ctx.name}",
                self.seen.setdefault((repo, version), now),
            )
            for version, (freight, by) in releases.read_releases(store, graph).items()
        }
        return ps.Repo(graph, history, promos, tasks, rels)

    # -- writing ----------------------------------------------------------------------
    async def _apply(self, repo: str, state: ps.Repo, eff: ps.Effect, now: float) -> int:
        store = self._store(repo)
        author = self.repos.ledger(repo).author
        try:
            if isinstance(eff, ps.Record):
                tip = releases.note_commits(store, eff, author, now)
                assert tip is not None
                store.cas_ref(refs.promotion_ref(eff.env, eff.version), tip, eff.expected)
            elif isinstance(eff, ps.StartTask):
                self._start(repo, state, eff)
            elif isinstance(eff, ps.MoveEnv):
                if not await self._move(repo, eff, author, now):
                    return 0
            else:
                return 0
        except CasConflict as e:
            log.info("promotion write lost a race (%s); the next pass re-reads", e)
            return 0
        self.changed(repo, "")  # tell replicas the refs moved
        if isinstance(eff, ps.Record | ps.MoveEnv):
            self.on_change(change_of(repo, state, eff))
        return 1

    def _start(self, repo: str, state: ps.Repo, eff: ps.StartTask) -> None:
        ledger = self.repos.ledger(repo)
        store = self._store(repo)
        env = state.graph.env(eff.env)
        assert env is not None
        cfg = releases.config_commit(store)
        spec = releases.gate_spec(env, eff, lambda p: store.read_file(cfg, p) if cfg else None)
        oid = releases.task_commit(store, eff, spec, ledger.author)
        try:
            store.cas_ref(refs.task_ref(eff.task_id), oid, None)
        except CasConflict:
            pass  # made by an earlier pass: queueing below is idempotent too
        queue_submission(ledger, eff.task_id, GATE_PRIORITY, self.ctx.cfg.limits)
        self.changed(repo, eff.task_id)

    async def _move(self, repo: str, eff: ps.MoveEnv, author: tuple[str, str], now: float) -> bool:
        """The release commit and its promotion note, in one atomic CAS of both refs."""
        store = self._store(repo)
        owner = self.replicas.owner_of(repo)
        epoch = owner[2] if owner else 0
        term = self.term()
        why = pcore.stand_down(
            epoch, releases.owner_epoch_of(store, eff.env), term, releases.term_of(store, eff.env)
        )
        if why is not None:
            log.warning("env/%s not moved: %s", eff.env, why)
            return False
        env_oid = releases.env_commit(store, eff, author, epoch, now, term or 0)
        note_oid = releases.note_commits(store, eff.record, author, now)
        moves = [
            (refs.env_ref(eff.env), env_oid, eff.expected_env),
            (refs.promotion_ref(eff.env, eff.version), note_oid, eff.record.expected),
        ]
        ok = await asyncio.to_thread(gitcli.update_ref_cas, self.repos.path(repo), moves)
        if not ok:
            log.info(
                "release of %s into %s lost a race; the next pass re-reads", eff.version, eff.env
            )
        return ok

    # -- pushes -----------------------------------------------------------------------
    async def on_push(
        self, repo: str, updates: list[RefUpdate], emit: Callable[[str], None] | None
    ) -> list[str]:
        """A release tag or promote/<version> ref was pushed: stream its promotion's report
        until it settles, waits for an approval (say how to give it) or FOLLOW_S passes
        (say how to follow it)."""
        named = [u for u in updates if u.new != ZERO and refs.release_version_of(u.ref)]
        if not named or not self.replicas.is_owner(repo):
            return []
        graph, errs, _ = releases.read_graph(self._store(repo))
        if graph is None:
            return [f"kovanex: {e}" for e in errs]  # no environments: a tag is just a tag
        versions = [
            v
            for u in named
            if (v := refs.release_version_of(u.ref)) is not None
            and pcore.valid_version(v)
            and (u.ref.startswith(refs.PROMOTE_PREFIX) or graph.is_release(v))
        ]
        if not versions:
            return []
        now = self.ctx.clock.time()
        for v in versions:
            self.seen.setdefault((repo, v), now)
        self.kick(repo)
        say = emit or (lambda line: None)
        printed: set[str] = set()
        deadline = self.ctx.clock.monotonic() + FOLLOW_S
        while True:
            async with self._passed:
                try:
                    await self.ctx.clock.wait_for(self._passed.wait(), 2 * TICK_S + 1)
                except TimeoutError:
                    pass
            promos = [
                p
                for p in releases.read_promotions(self._store(repo)).values()
                if p.version in versions
            ]
            for p in sorted(promos, key=lambda p: p.opened):
                for oid, subject in releases.notes_of(self._store(repo), p.env, p.version):
                    line = report_line(p.env, subject)
                    if oid not in printed and line is not None:
                        say(line)
                    printed.add(oid)
            if self.errors.get(repo):
                return [f"kovanex: {e}" for e in self.errors[repo]]
            if promos and all(p.status not in ps.LIVE for p in promos) and not self.busy.get(repo):
                return []
            waiting = [p for p in promos if p.status == ps.WAITING]
            if (
                waiting
                and not self.busy.get(repo)
                and all(p.status not in ps.LIVE or p.status == ps.WAITING for p in promos)
            ):  # only a person moves it on now: holding the push to FOLLOW_S shows nothing
                return [
                    f"kovanex: {p.id} waits for approval: kovanex approve {p.id}" for p in waiting
                ]
            if self.ctx.clock.monotonic() > deadline:
                live = [p.id for p in promos if p.status in ps.LIVE]
                return [
                    f"kovanex: still running ({', '.join(live) or 'starting'}); follow it: "
                    f"kovanex env list, or git fetch && git log promotion/{live[0] if live else ''}"
                ]

    # -- requests ---------------------------------------------------------------------
    def repo_of(self, args: dict[str, Any], seen: Callable[[str], bool] = lambda r: True) -> str:
        """The repo named, or the one repo here (that `seen` shows) declaring environments."""
        if args.get("repo"):
            repo = str(args["repo"])
            if repo not in self.repos.all():
                raise PromotionRefused(
                    f"no repo {repo} on {self.ctx.name}; see `kovanex repo list`", "unknown_repo"
                )
            if not self.replicas.is_owner(repo):
                raise PromotionRefused(
                    f"{self.ctx.name} only mirrors {repo}; run this on its owner", "owner_moved"
                )
            return repo
        have = [
            r
            for r in self.repos.owned()
            if seen(r) and (self.gather(r) is not None or self.errors.get(r))
        ]
        if len(have) == 1:
            return have[0]
        if not have:
            raise PromotionRefused(
                "no repo here declares environments; commit .kovanex/environments.toml "
                "on the default branch and push it",
                "no_environments",
            )
        raise PromotionRefused(
            f"several repos declare environments ({', '.join(have)}); pass --repo", "ambiguous_repo"
        )

    async def request(self, op: str, args: dict[str, Any], by: str) -> dict[str, Any]:
        """One request from `by`: the API's bearer token name (kovanex/api/promotions.py)."""
        repo = self.repo_of(args)
        req: pcore.Request
        if op == "promote":
            req = pcore.PromoteReq(str(args["version"]), str(args["env"]), by)
        elif op == "approve":
            req = pcore.ApproveReq(str(args["id"]), by)
        elif op == "verify":
            req = pcore.VerifyReq(str(args["env"]), by)
        else:
            req = pcore.RollbackReq(str(args["env"]), by)
        async with self._lock:
            state = self.gather(repo)
            if state is None:
                raise ControlError("; ".join(self.errors.get(repo, ["no environments"])))
            now = self.ctx.clock.time()
            effects = pcore.handle(state, req, now)
            for eff in effects:
                if isinstance(eff, ps.Refuse):
                    raise PromotionRefused(eff.reason, eff.code)
            for eff in effects:
                if not await self._apply(repo, state, eff, now) and isinstance(eff, ps.Record):
                    raise ControlError("another change landed at the same moment; try again")
        self.kick(repo)
        reply = next((e for e in effects if isinstance(e, ps.Reply)), ps.Reply("done"))
        return {"repo": repo, "id": reply.id, "message": reply.text, "by": by}

    def report(self, args: dict[str, Any]) -> dict[str, Any]:
        """The notes of one promotion (for `--follow`), and whether it is still live."""
        repo = self.repo_of(args)
        env, _, version = str(args["id"]).partition("/")
        store = self._store(repo)
        promos = releases.read_promotions(store)
        p = promos.get(str(args["id"]))
        notes = [
            {"oid": oid, "line": line}
            for oid, s in releases.notes_of(store, env, version)
            if (line := report_line(env, s)) is not None
        ]
        # a promotion that released may open the next hop: report those as they come
        nxt = [q.id for q in promos.values() if q.version == version and q.source == env]
        return {
            "id": args["id"],
            "status": p.status if p else "",
            "live": bool(p and p.status in ps.LIVE) or bool(self.busy.get(repo)),
            "notes": notes,
            "next": nxt,
        }

    def env_list(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        repo = self.repo_of(args)
        state = self.gather(repo)
        if state is None:
            raise ControlError("; ".join(self.errors.get(repo, ["no environments"])))
        labels = {
            m["name"]: m.get("labels", {})
            for m in self.members()
            if m.get("status") in ("alive", "suspect")
        }
        labels[self.ctx.name] = dict(self.ctx.cfg.labels)
        out = []
        for e in state.graph.envs:
            head = state.head(e.name)
            live = [p for p in state.promotions.values() if p.env == e.name and p.status in ps.LIVE]
            rel_p = state.promotions.get(ps.promotion_id(e.name, head.version)) if head else None
            out.append(
                {
                    "name": e.name,
                    "repo": repo,
                    "label": f"{e.label[0]}={e.label[1]}",
                    "from": list(e.sources),
                    "auto": e.auto,
                    "nodes": sorted(
                        n for n, lb in labels.items() if lb.get(e.label[0]) == e.label[1]
                    ),
                    "release": None
                    if head is None
                    else {
                        "version": head.version,
                        "freight": head.freight,
                        "commit": head.commit,
                        "verified": state.verified(e.name, head),
                        "rollback_of": head.rollback_of or None,
                        "gates": gate_rows(rel_p, state.tasks) if rel_p else [],
                    },
                    "waiting": [
                        {
                            "id": p.id,
                            "version": p.version,
                            "status": p.status,
                            "by": p.by,
                            "approvals": list(dict.fromkeys(p.approvals)),
                            "needs": e.approvals,
                            "gates": gate_rows(p, state.tasks),
                        }
                        for p in sorted(live, key=lambda p: p.opened)
                    ],
                    "errors": self.errors.get(repo, []),
                }
            )
        return out
