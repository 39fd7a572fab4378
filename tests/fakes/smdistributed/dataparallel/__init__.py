"""FAKE `smdistributed.dataparallel` (see tests/fakes/README.md)."""
