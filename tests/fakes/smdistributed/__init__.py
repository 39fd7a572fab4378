"""FAKE `smdistributed` package for tests (see tests/fakes/README.md): not AWS's library.

Keeps a log of the calls made to the fake modules below.
"""
import json
import os
import threading

calls = []
_lock = threading.Lock()  # the fake SMP runs ranks as threads


def record(name, **details):
    path = os.environ.get("FAKE_SMDIST_LOG")
    with _lock:
        calls.append((name, details))
        if path:
            with open(path, "a") as handle:
                handle.write(json.dumps({"call": name, "details": details}, sort_keys=True, default=str) + "\n")


def names():
    return [name for name, _ in calls]


def reset():
    del calls[:]


def env_int(name, default):
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)
