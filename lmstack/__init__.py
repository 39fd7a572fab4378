"""lmstack's tools that run on your machine: `lmstack.start` (start and watch a training run
on the deployed state machine) and the local demo."""
