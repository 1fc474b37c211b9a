"""A raw-protocol NATS client (a plain socket speaking INFO/CONNECT/SUB/PUB/HPUB/PING), as an
attacker without nats-py would write it (issue 24): what the server answers to it is what
a step or a stranger on the network gets."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

INBOX = "_INBOX.raw"


class RawNats:
    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.timeout = timeout
        line = self._line()
        assert line.startswith("INFO "), line
        self.info: dict[str, Any] = json.loads(line[5:])

    def close(self) -> None:
        self.sock.close()

    def _line(self) -> str:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return "<closed>"
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line.decode(errors="replace")

    def _payload(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def connect(self, **opts: Any) -> str:
        """CONNECT then PING: "PONG" when accepted, else the server's -ERR line."""
        body = {"verbose": False, "pedantic": False, "headers": True, **opts}
        self.sock.sendall(f"CONNECT {json.dumps(body)}\r\nPING\r\n".encode())
        return self.reply()

    def reply(self) -> str:
        """The next PONG, -ERR or closed connection (skipping the server's PINGs)."""
        while True:
            line = self._line()
            if line == "PING":
                self.sock.sendall(b"PONG\r\n")
                continue
            if line in ("PONG", "<closed>") or line.startswith("-ERR"):
                return line

    def request(self, subject: str, data: bytes = b"", headers: str = "", **login: Any) -> str:
        """One request/reply: the reply's text, or the -ERR line (a refusal). With `login`
        the CONNECT goes in the same write, as a client that never waits for an answer."""
        out = b""
        if login:
            body = {"verbose": False, "pedantic": False, "headers": True, **login}
            out += f"CONNECT {json.dumps(body)}\r\n".encode()
        out += f"SUB {INBOX} 1\r\n".encode()
        if headers:
            head = f"NATS/1.0\r\n{headers}\r\n".encode()
            size = f"{len(head)} {len(head) + len(data)}"
            out += f"HPUB {subject} {INBOX} {size}\r\n".encode() + head + data + b"\r\n"
        else:
            out += f"PUB {subject} {INBOX} {len(data)}\r\n".encode() + data + b"\r\n"
        try:
            self.sock.sendall(out)
        except OSError:
            return "<closed>"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            line = self._line()
            if line == "PING":
                self.sock.sendall(b"PONG\r\n")
            elif line.startswith("-ERR") or line == "<closed>":
                return line
            elif line.startswith(("MSG ", "HMSG ")):
                return self._payload(int(line.split()[-1])).decode(errors="replace")
        return "<no reply>"
