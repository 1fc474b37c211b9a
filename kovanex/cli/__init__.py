"""The `kovanex` command line (git- and Serf-style verbs)."""
