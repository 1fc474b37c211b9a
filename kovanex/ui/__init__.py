"""The web dashboard at /ui/: server-rendered pages with htmx, over the /v1 operations (ADR 0032)."""
