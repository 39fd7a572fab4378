"""The specification the training image and the control plane share, TF-free (Python 3.8).

`fields` (an input field and its messages) is the leaf; `conditions` (rules between fields);
`contract` (channels, paths and S3 prefixes both sides spell the same); `families` (model
configurations, presets, capabilities); `hardware` (instance types and GPUs); `shards` (the
dataset's shard format); `job` (strategies, image variants, the hyperparameter tables and the
rules every job obeys). Nothing here imports TensorFlow or anything outside `lm.spec`.
"""
