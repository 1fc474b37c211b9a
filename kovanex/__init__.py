"""Kovanex: a git-native task engine. A task is a git branch; git log is the audit trail."""

__version__ = "0.1.0"
