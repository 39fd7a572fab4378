"""FAKE SMP launcher for tests (not part of AWS's library; see tensorflow.py here).

    python -m smdistributed.modelparallel.run RANKS MODULE [ARGS...]

runs `MODULE.main(ARGS)` as RANKS ranks of one fake SMP job, one thread each, the way
`mpirun` starts one process per GPU; exits with the highest exit status.
"""
import importlib
import sys

from smdistributed.modelparallel import tensorflow as smp


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or not argv[0].isdigit():
        sys.stderr.write(__doc__)
        return 2
    target = importlib.import_module(argv[1]).main
    statuses = smp.run_ranks(int(argv[0]), target, argv[2:])
    return max(status or 0 for status in statuses)


if __name__ == "__main__":
    sys.exit(main())
