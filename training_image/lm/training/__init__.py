"""Training: the loop (`train`), AdamW and its schedule (`optim`), checkpoints that survive a lost
instance (`checkpoint`), and what a run reports (`summaries`, `tracking`, `gpu_usage`)."""
