"""An engine library that several processes want at once is built once
(native/build.py ``_build_once``): they take turns on a lock on the cache
directory, and whoever comes after the first finds it built.  The build here is
a stand-in that takes a while (the window in which a second builder would
start); each caller opens the directory itself, as another process does (flock
locks belong to the open file, so callers in one process exclude each other
the same way).  Without the lock, the same callers all build: the check can
fail."""
import contextlib
import os
import threading
import time

from fairseq_aggressive.native import build

CALLERS = 4


def _callers(tmp_path, **lock):
    """CALLERS threads wanting one library at once; how many built it."""
    path = str(tmp_path / "engine-test.so")
    built = []

    def slow_build(out=path):
        built.append(out)
        time.sleep(0.3)  # the compile: the window another builder would start in
        part = f"{out}.{threading.get_ident()}.part"
        with open(part, "w") as f:
            f.write("library")
        os.replace(part, out)  # (appears whole, as _build's does)

    start = threading.Barrier(CALLERS)

    def want():
        start.wait()
        build._build_once(path, " (a stand-in)", slow_build, **lock)
        assert os.path.isfile(path)

    threads = [threading.Thread(target=want) for _ in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert sorted(os.listdir(tmp_path)) == ["engine-test.so"]  # nothing else written
    return len(built)


def test_a_library_wanted_at_once_is_built_once(tmp_path):
    assert _callers(tmp_path) == 1
    assert _callers(tmp_path) == 0  # built already: nobody builds again


def test_without_the_lock_every_caller_builds(tmp_path):
    assert _callers(tmp_path, lock=lambda directory: contextlib.nullcontext()) == CALLERS
