"""The suite's check for processes a test leaves running (support/leftovers.py) finds one and
kills it, and does not count processes that ended or started before the test."""
import subprocess
import time

from support import leftovers


def test_a_process_left_running_is_found_and_killed():
    leftovers.install()
    before = subprocess.Popen(["sleep", "30"])
    time.sleep(0.05)
    start = leftovers.now() + 1  # a later tick: `before` started earlier
    time.sleep(2.5 / leftovers._HZ + 0.02)
    done = subprocess.Popen(["true"])
    done.wait()
    left = subprocess.Popen(["sleep", "30"])
    found = leftovers.reap(start, grace=0.5)
    assert left.pid in found and "sleep 30" in found[left.pid], found
    assert before.pid not in found and done.pid not in found, found
    assert left.wait(timeout=5) == -9  # killed
    before.kill()
    before.wait()
