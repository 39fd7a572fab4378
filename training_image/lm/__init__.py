"""lmstack's training runtime: model, data, training loop, data preparation, serving.

Importing `lm` imports no TensorFlow; `lm.config`, `lm.job`, `lm.shards` and `lm.plan`
stay importable without it (the CDK app uses them at synth time).
"""
