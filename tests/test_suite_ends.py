"""`make test` ends when a pytest-xdist worker dies or a test hangs, naming the test lost (issue 54): real pytest and
real xdist with this project's pytest settings (pyproject.toml) on a tiny test folder of their own, in a subprocess."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILLER = "import time\n\ndef test_one():\n    time.sleep(1)\n\ndef test_two():\n    time.sleep(1)\n"


def tiny_suite(tmp_path: Path, last: str) -> Path:
    """Four modules of two 1 s tests, then `last`, the module handed out last under --dist loadfile."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in "abcd":
        (suite / f"test_{name}.py").write_text(FILLER)
    (suite / "test_last.py").write_text(textwrap.dedent(last))
    return suite


def pytest_of(suite: Path, *flags: str) -> subprocess.Popen:
    """`make test`'s pytest command (2 workers, --dist loadfile) with the project's pyproject.toml on `suite`."""
    return subprocess.Popen([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                             str(suite), "-p", "no:cacheprovider", "-q", "-n", "2", "--dist", "loadfile", *flags,
                             str(suite)], cwd=suite, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_a_killed_worker_ends_the_suite_at_once_naming_its_test(tmp_path):
    """SIGKILL to the worker running the last module (the case that waited forever in CI on 2026-11-29: xdist
    replaced the worker, which then waited for work that never came)."""
    pid_file = tmp_path / "victim.pid"
    suite = tiny_suite(tmp_path, f"""
        import os, time

        def test_victim():
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            time.sleep(600)

        def test_after():
            pass
        """)
    proc = pytest_of(suite)
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    killed = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - killed < 30, out
    assert proc.returncode == 1, out
    assert "node down: Not properly terminated" in out
    assert "crashed while running 'test_last.py::test_victim'" in out
    assert "1 failed, 8 passed in " in out  # test_after, left in the dead worker, not run


@pytest.mark.slow
def test_a_hung_test_fails_after_the_time_limit_with_its_stack_and_the_suite_goes_on(tmp_path):
    """pytest-timeout (the project's `timeout`, shortened here to 3 s): the hung test fails, the next one runs."""
    suite = tiny_suite(tmp_path, """
        import threading

        def test_hangs():
            threading.Event().wait()

        def test_after():
            pass
        """)
    proc = pytest_of(suite, "--timeout", "3")
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, out
    assert "FAILED test_last.py::test_hangs - Failed: Timeout (>3.0s) from pytest-timeout." in out
    assert "threading.Event().wait()" in out  # where it hung
    assert "1 failed, 9 passed in " in out
