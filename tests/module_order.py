"""The order the two xdist workers take the test modules in: the longest first.

pytest.ini runs `--dist loadscope --no-loadscope-reorder`: each module goes whole to the next free worker, in
collection order. Taken in the order of their file names, a few long modules (the demo, the SMP replicas, the
Python 3.8 run) came last and left one core idle for minutes; taken longest first, the two workers end together
(the longest-processing-time rule). MODULE_SECONDS holds each module's seconds from a full run
(`python tests/module_order.py JUNIT_XML` rewrites it from `pytest --junitxml=JUNIT_XML`); a module not in it runs
after the known ones. The times only order the run: a stale table makes the suite slower, never wrong.
"""
import collections
import json
import os
import sys
import xml.etree.ElementTree as ElementTree

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_SECONDS = os.path.join(HERE, "module_seconds.json")


def module_of(nodeid):
    return nodeid.split("::", 1)[0]


def longest_first(items):
    """`items` (pytest's collected items) stably sorted by their module's recorded seconds, longest first."""
    with open(MODULE_SECONDS) as handle:
        seconds = json.load(handle)
    return sorted(items, key=lambda item: -seconds.get(module_of(item.nodeid), 0.0))


def seconds_from_junit(path):
    """Each module's seconds (its tests' setup, call and teardown) from a JUnit XML report."""
    seconds = collections.Counter()
    for case in ElementTree.parse(path).iter("testcase"):
        module = case.get("classname").split(".")
        while module and not module[-1].startswith("test_"):
            module.pop()  # a test class's name after its module's
        seconds["/".join(module) + ".py"] += float(case.get("time") or 0.0)
    return {module: round(value, 1) for module, value in sorted(seconds.items())}


if __name__ == "__main__":
    with open(MODULE_SECONDS, "w") as handle:
        json.dump(seconds_from_junit(sys.argv[1]), handle, indent=0, sort_keys=True)
        handle.write("\n")
