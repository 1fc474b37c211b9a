"""`make test` keeps the suite's JUnit XML and every test's time in build/test-report, and
prints the slowest 25 at the end, pass or fail. Checked by running the Makefile's own
recipe (as `make -n` prints it) on a small real suite that fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.durations import main, read, render

ROOT = Path(__file__).resolve().parent.parent

SUITE = """
import time

def test_slow():
    time.sleep(0.6)  # the workload being measured, not a wait for anything

def test_quick():
    pass

def test_broken():
    assert 1 == 2
"""


def _recipe(report: Path) -> str:
    """The test target's pytest line and what follows it, as make would run them."""
    bin_dir = Path(sys.executable).parent
    out = subprocess.run(
        ["make", "-n", "-s", "test", f"BIN={bin_dir}", f"STAMP={sys.executable}",
         f"TEST_REPORT={report}"],  # fmt: skip
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if "-m pytest" in ln)
    before = [ln for ln in lines[:start] if ln.startswith("mkdir -p")]
    return "\n".join([*before, *lines[start:]])


def test_make_test_writes_the_report_and_prints_the_slowest_even_when_it_fails(
    tmp_path: Path,
) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_small.py").write_text(SUITE)
    report = tmp_path / "report"
    # no plugin but xdist, which the recipe's `-n` needs (in the workers too: they inherit it)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTEST_PLUGINS": "xdist.plugin"}  # fmt: skip
    run = subprocess.run(
        ["sh", "-c", _recipe(report)], cwd=suite, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    # pytest's failure, not hidden; -x under xdist stops the workers as pytest stops on a
    # KeyboardInterrupt, so the code is 2 (interrupted), not the serial run's 1
    assert run.returncode == 2, run.stdout + run.stderr
    assert "stopping after 1 failures" in run.stdout and "xdist" in run.stdout
    assert (report / "junit.xml").is_file()
    tail = run.stdout[run.stdout.index("== durations") :]
    assert "3 tests (1 failed, 2 passed)" in tail
    first = tail.splitlines()[2]
    assert first.endswith("test_small::test_slow") and "passed" in first
    assert "failed   test_small::test_broken" in tail
    kept = (report / "durations.txt").read_text().splitlines()
    assert len(kept) == 4 and kept[1].endswith("test_small::test_slow")


def test_the_top_is_the_slowest_n_and_the_file_keeps_all(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    cases = "".join(
        f'<testcase classname="tests.test_t" name="test_{i}" time="{i}.5"/>' for i in range(30)
    )
    junit.write_text(f'<testsuites><testsuite time="99.0">{cases}</testsuite></testsuites>')
    got, wall = read(junit)
    assert wall == 99.0 and [c.seconds for c in got[:2]] == [29.5, 28.5]
    top = render(got, wall, 25).splitlines()
    assert top[0] == "slowest 25 of 30 tests (30 passed) in 99.0s wall"
    assert len(top) == 26 and top[-1].endswith("test_t::test_5")
    out = tmp_path / "d.txt"
    assert main([str(junit), "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 31


def test_no_report_is_said_and_does_not_fail_the_build(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path / "missing.xml")]) == 0
    assert "no report from" in capsys.readouterr().err
