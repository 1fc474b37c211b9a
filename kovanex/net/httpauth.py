"""Who is asking, and may they: the HTTP listener's credentials, by scope.

Two kinds of caller. Nodes present the cluster secret and may do anything (replication,
remote runs). People and CI present a user token (kovanex/tokens.py), as the Basic-auth
password with any user name (as on GitHub and GitLab) or as a bearer token, and get what
its scope grants: `read` fetches, `push` also pushes, `admin` also drives the API.
"""

from __future__ import annotations

import base64
import hmac
from dataclasses import dataclass

from kovanex.tokens import PREFIX, SCOPES, Refused, TokenBook, grants

NODE = "node"  # the scope of a caller holding the cluster secret


@dataclass(frozen=True)
class Principal:
    name: str  # REMOTE_USER for hooks: the token's name, or the node's user name
    scope: str  # "node" or a token scope
    repos: str = "*"

    def may(self, scope: str, repo: str | None = None) -> bool:
        return self.scope == NODE or grants(self.scope, self.repos, scope, repo)

    def why_not(self, scope: str, repo: str | None) -> str:
        if SCOPES.index(self.scope) < SCOPES.index(scope):
            return (
                f"token {self.name} has scope {self.scope}; this needs {scope} "
                f"(kovanex token create NAME --scope {scope})"
            )
        return f"token {self.name} is limited to repos {self.repos!r}; {repo} is not one of them"


def credential(authorization: str) -> tuple[str, str] | None:
    """(user, secret) from a Basic or Bearer header; None when there is none."""
    scheme, _, cred = authorization.partition(" ")
    scheme, cred = scheme.lower(), cred.strip()
    if scheme == "bearer" and cred:
        return "", cred
    if scheme == "basic":
        try:
            user, _, password = base64.b64decode(cred, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return user, password
    return None


def authenticate(
    authorization: str, cluster_secret: str, book: TokenBook | None
) -> Principal | Refused | None:
    """A Principal; Refused (a named token that must not pass); None (no usable credential)."""
    cred = credential(authorization)
    if cred is None:
        return None
    user, secret = cred
    if hmac.compare_digest(secret.encode(), cluster_secret.encode()):
        return Principal(user or "kovanex", NODE)
    if book is None or not secret.startswith(PREFIX):
        return None
    try:
        rec = book.verify(secret)
    except Refused as e:
        return e
    return Principal(rec.name, rec.scope, rec.repos)


def git_scope(rest: str, query: str) -> str:
    """What a smart-HTTP request needs: pushing is receive-pack, everything else reads."""
    push = rest.endswith("/git-receive-pack") or "service=git-receive-pack" in query
    return "push" if push else "read"


def pkt(line: str) -> bytes:
    data = line.encode()
    return f"{len(data) + 4:04x}".encode() + data


def refusal_advertisement(service: str, message: str) -> bytes:
    """A ref advertisement that is only an ERR line: git prints `remote error: <message>`,
    where a bare 401/403 would show the user nothing but a status code."""
    return pkt(f"# service={service}\n") + b"0000" + pkt(f"ERR {message}\n")
