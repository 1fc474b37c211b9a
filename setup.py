"""Ship the top-level hooks/ and templates/ inside the wheel, as kovanex/_data/ (ADR 0018).

Everything else about the build is in pyproject.toml. The two folders stay at the top of
the repo, where a reader looks for them; a built wheel carries copies, which
kovanex.paths finds with importlib.resources. An editable install needs no copy: there
kovanex.paths finds the folders in the checkout.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
DATA = ("hooks", "templates")


class BuildPyWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name in DATA:
            dst = Path(self.build_lib, "kovanex", "_data", name)
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(
                HERE / name, dst, ignore=shutil.ignore_patterns("__pycache__", "*.py[co]")
            )


setup(cmdclass={"build_py": BuildPyWithData})
