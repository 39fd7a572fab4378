"""What the planner assumes of an instance's speed beyond the peak FLOP/s of its GPUs
(`lm.spec.hardware`, which the runtime reads too): the network between its hosts, and the model FLOP
utilization (MFU) its GPU reaches where lmstack has measured none.

Read only by the planner (`controlplane.planner`): every number is a published figure or a stated
assumption, with its source beside it.
"""
import collections

# Network bandwidth between hosts, Gbit/s (the EC2 instance type pages; "up to" figures taken
# at their burst value). The planner uses it for the data-parallel all-reduce time.
NETWORK_GBPS = {
    "ml.m5.xlarge": 10, "ml.m5.4xlarge": 10, "ml.c5.18xlarge": 25,
    "ml.g4dn.12xlarge": 50,
    "ml.g5.xlarge": 10, "ml.g5.2xlarge": 10, "ml.g5.12xlarge": 40, "ml.g5.24xlarge": 50, "ml.g5.48xlarge": 100,
    "ml.p3.2xlarge": 10, "ml.p3.8xlarge": 10, "ml.p3.16xlarge": 25, "ml.p3dn.24xlarge": 100,
    "ml.p4d.24xlarge": 400, "ml.p4de.24xlarge": 400, "ml.p5.48xlarge": 3200,
    "ml.p5.4xlarge": 100, "ml.p5e.48xlarge": 3200, "ml.p5en.48xlarge": 3200, "ml.p6-b200.48xlarge": 3200,
    "ml.g6.xlarge": 10, "ml.g6.2xlarge": 10, "ml.g6.4xlarge": 25, "ml.g6.8xlarge": 25, "ml.g6.16xlarge": 25,
    "ml.g6.12xlarge": 40, "ml.g6.24xlarge": 50, "ml.g6.48xlarge": 100,
    "ml.g6e.xlarge": 20, "ml.g6e.2xlarge": 20, "ml.g6e.4xlarge": 20, "ml.g6e.8xlarge": 25, "ml.g6e.16xlarge": 35,
    "ml.g6e.12xlarge": 100, "ml.g6e.24xlarge": 200, "ml.g6e.48xlarge": 400,
}

# The model FLOP utilization (MFU) the planner assumes per GPU where lmstack has no measurement of
# its own (bench/gpu.py's replace these: planner.assumed_mfu): (fraction, source).
# Published runs of tuned PyTorch stacks (MFU in their papers' 6N + attention convention, the
# convention of lm.spec.families.flops_per_token); a TensorFlow GPT usually gets less.
PUBLISHED_MFU = collections.OrderedDict([
    ("V100", (0.30, "Megatron-LM (Shoeybi et al. 2019): 39 of 125 TFLOP/s per V100, 30 %")),
    ("A100", (0.50, "Megatron-LM (Narayanan et al. 2021): 44-52 % for 1.7B-1T on A100; llm-foundry MPT "
                    "760M/1B bf16 on 8 x A100-80GB: 56.9/59.9 %")),
    ("H100", (0.418, "llm-foundry MPT 1B bf16 on H100: 41.8 %; 760M: 34.9 %")),
    ("H200", (0.418, "assumed equal to H100 (the same tensor cores): llm-foundry MPT 1B, 41.8 %")),
    ("B200", (0.418, "assumed equal to H100 (no published run we know of): llm-foundry MPT 1B, 41.8 %")),
    ("T4", (0.30, "assumed equal to V100 (no published LLM training MFU we know of): Megatron-LM 2019, 30 %")),
    ("A10G", (0.30, "assumed equal to V100 (no published LLM training MFU we know of): Megatron-LM 2019, 30 %")),
    ("L4", (0.30, "assumed equal to V100 (no published LLM training MFU we know of): Megatron-LM 2019, 30 %")),
    ("L40S", (0.30, "assumed equal to V100 (no published LLM training MFU we know of): Megatron-LM 2019, 30 %")),
])
