"""lmstack's training runtime, the code every training image holds.

`lm.spec` is the TF-free specification the control plane shares (hyperparameters, channels and
paths, shard format, model configurations); `lm.models`, `lm.data`, `lm.training`,
`lm.distributed`, `lm.serving` and `lm.hf` are the runtime. Importing `lm` or `lm.spec` imports
no TensorFlow; nothing in `lm` imports the control plane (`controlplane`, `stacks`, `lmstack`).
"""
