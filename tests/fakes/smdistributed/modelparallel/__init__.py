"""FAKE `smdistributed.modelparallel` (see tests/fakes/README.md)."""
