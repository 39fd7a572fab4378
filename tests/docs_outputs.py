"""The outputs the documentation shows come from the commands shown with them, run on this checkout's code.

A block of README.md or docs/*.md written as

    <!-- output: tests/docs_outputs.py -->
    ```console
    $ .venv/bin/python -m lmstack.plan --preset gpt-125m ... | grep -E '^chosen'
    chosen: single
    ```

holds a command (the `$ ` line and the lines after it indented by four spaces, which continue it: after a
backslash, or inside a quoted argument) and what it prints: bash runs it from the repository root with
`set -o pipefail`, and it must succeed. tests/test_docs_outputs.py fails where a block differs from what its
command prints now; after a change of the planner or the prices,

    .venv/bin/python tests/docs_outputs.py --write

writes every block again from the code (then read the diff: the prose around a block may need the same change).
"""
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
MARKER = "<!-- output: tests/docs_outputs.py -->"
BLOCK = re.compile(r"^%s\n```console\n\$ (?P<command>[^\n]*(?:\n    [^\n]*)*)\n(?P<output>.*?)^```$" % re.escape(MARKER),
                   re.S | re.M)


def blocks(page):
    """(command, output as written) of each marked block of `page`."""
    return [(found.group("command"), found.group("output")) for found in BLOCK.finditer(page.read_text())]


def run(command):
    """What `command` prints from the repository root (stdout and stderr), with this checkout's packages first;
    RuntimeError where it fails."""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "training_image")]),
                       COLUMNS="100")
    result = subprocess.run(["bash", "-c", "set -o pipefail; " + command], cwd=str(ROOT), env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if result.returncode:
        raise RuntimeError("`%s` exited %d:\n%s" % (command, result.returncode, result.stdout[-3000:]))
    return result.stdout


def write(page):
    """Rewrite every marked block of `page` with what its command prints now; whether anything changed."""
    text = page.read_text()
    written = BLOCK.sub(lambda found: "%s\n```console\n$ %s\n%s```" % (
        MARKER, found.group("command"), run(found.group("command"))), text)
    page.write_text(written)
    return written != text


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/docs_outputs.py --write")
    for changed in [page for page in PAGES if write(page)]:
        print("rewrote %s" % changed.relative_to(ROOT))
