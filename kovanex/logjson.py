"""JSON-lines logs (`kovanex agent --log-format json`, or `[log] format = "json"`).

One object per line, so journald, Loki or `jq` read the agent's log without a regex:
`time` (RFC 3339, UTC), `level`, `logger`, `node`, `msg`, and `exc` with the traceback
when there is one. Messages are formatted first (`%s` args filled in), as the text format
does, so both formats say the same thing.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime


class JsonFormatter(logging.Formatter):
    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "node": self.node,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup(node: str, level: str, fmt: str) -> None:
    """Configure the root logger for the agent process in the chosen format."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter(node))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {node} %(name)s %(levelname)s %(message)s")
        )
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
