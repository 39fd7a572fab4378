"""What `lm.plan` assumes about GPUs and what SageMaker charges for them.

Every number here is a published figure or a stated assumption; change it here and
nowhere else. Pure Python, no TensorFlow.
"""
import collections

# Peak dense (no structured sparsity) tensor FLOP/s per precision, from NVIDIA's data sheets:
# V100 SXM2 (Tesla V100 data sheet, 2020), T4 (T4 data sheet), A10 (A10 data sheet; AWS's
# A10G is assumed to match it), A100 SXM4 (A100 data sheet, 2021), H100 SXM5 (H100 data
# sheet, 2023). "fp32" is what an fp32 model gets: TensorFlow runs fp32 matmuls as
# TensorFloat-32 on Ampere and newer by default (TF >= 2.4), so there it is the TF32 figure.
# A precision missing from a row is not supported by that GPU.
GPU = collections.namedtuple("GPU", "name generation peak_flops default_precision min_cuda")

_T = 1e12
GPUS = collections.OrderedDict((gpu.name, gpu) for gpu in [
    GPU("T4", "turing", {"fp32": 8.1 * _T, "fp16": 65 * _T}, "fp16", (10, 0)),
    GPU("V100", "volta", {"fp32": 15.7 * _T, "fp16": 125 * _T}, "fp16", (9, 0)),
    GPU("A10G", "ampere", {"fp32": 62.5 * _T, "fp16": 125 * _T, "bf16": 125 * _T}, "fp16", (11, 1)),
    GPU("A100", "ampere", {"fp32": 156 * _T, "fp16": 312 * _T, "bf16": 312 * _T}, "bf16", (11, 0)),
    # Hopper (sm_90) code needs CUDA 11.8 or newer (CUDA 11.8 release notes).
    GPU("H100", "hopper", {"fp32": 494.7 * _T, "fp16": 989.4 * _T, "bf16": 989.4 * _T}, "bf16", (11, 8)),
    # H200 SXM (H200 data sheet, 2024): the H100's tensor cores with 141 GB HBM3e.
    GPU("H200", "hopper", {"fp32": 494.7 * _T, "fp16": 989.4 * _T, "bf16": 989.4 * _T}, "bf16", (11, 8)),
    # Ada (sm_89) needs CUDA 11.8 (CUDA 11.8 release notes). L4 (L4 data sheet, 2023) and
    # L40S (L40S data sheet, 2023): dense figures, half the data sheets' "with sparsity" ones.
    GPU("L4", "ada", {"fp32": 60 * _T, "fp16": 121 * _T, "bf16": 121 * _T}, "bf16", (11, 8)),
    GPU("L40S", "ada", {"fp32": 183 * _T, "fp16": 362 * _T, "bf16": 362 * _T}, "bf16", (11, 8)),
    # B200 (NVIDIA HGX B200 specifications, per GPU, dense): Blackwell (sm_100) code needs
    # CUDA 12.8 or newer (CUDA 12.8 release notes).
    GPU("B200", "blackwell", {"fp32": 1100 * _T, "fp16": 2250 * _T, "bf16": 2250 * _T}, "bf16", (12, 8)),
])
# The default precision per GPU is the one `lm.train --precision auto` picks (lm.job's help text).

# Default model FLOP utilization (MFU, 6N + 12LdT convention) per GPU, from published runs:
# - V100: Megatron-LM (Shoeybi et al. 2019): 39 TFLOP/s per V100 of 125 peak, 30 %.
# - A100: Megatron-LM (Narayanan et al. 2021) 44-52 % for 1.7B-1T; MosaicML llm-foundry
#   MPT 760M/1B on 8 x A100-80GB bf16: 56.9 %/59.9 %. We take 50 %.
# - H100: llm-foundry MPT 760M/1B on H100 bf16: 34.9 %/41.8 %. We take 35 %.
# - T4, A10G: no published LLM training MFU we know of; assumed equal to V100 (30 %).
# These are tuned PyTorch/Megatron stacks; a TensorFlow GPT usually gets less, so pass the
# MFU you measure (`lm.train` logs `mfu=`) with `--mfu`.
# - H200, B200: assumed equal to H100 (35 %); L4, L40S: assumed equal to V100 (30 %).
DEFAULT_MFU = {"T4": 0.30, "V100": 0.30, "A10G": 0.30, "A100": 0.50, "H100": 0.35, "H200": 0.35, "B200": 0.35,
               "L4": 0.30, "L40S": 0.30}

# SageMaker Training on-demand price per instance-hour, region us-east-1, USD, from the
# Amazon SageMaker pricing page ("Training" tab), as of 2024-06. Re-checked 2026-12 for the
# instance types added then (P5 4xlarge, P5e, P5en, P6-B200, G6, G6e): the pricing page could
# not be reached from where this table is kept, and no copy of its SageMaker rows was found, so
# those types carry no price here (UNPRICED): the planner then reports no cost for them unless
# a training plan's price is given (`lm.plan --usd-per-instance-hour`). Check the page before
# you budget a large run.
PRICE_REGION = "us-east-1"
PRICE_DATE = "2024-06"
ON_DEMAND_USD_PER_HOUR = {
    "ml.m5.xlarge": 0.23,
    "ml.m5.4xlarge": 0.922,
    "ml.c5.18xlarge": 3.672,
    "ml.g4dn.12xlarge": 4.89,
    "ml.g5.xlarge": 1.408,
    "ml.g5.2xlarge": 1.515,
    "ml.g5.12xlarge": 7.09,
    "ml.g5.24xlarge": 10.18,
    "ml.g5.48xlarge": 20.36,
    "ml.p3.2xlarge": 3.825,
    "ml.p3.8xlarge": 14.688,
    "ml.p3.16xlarge": 28.152,
    "ml.p3dn.24xlarge": 35.894,
    "ml.p4d.24xlarge": 37.688,
    "ml.p4de.24xlarge": 47.11,
    "ml.p5.48xlarge": 113.068,
}

# Managed spot training: AWS advertises "up to 90 %" savings; spot GPU capacity typically
# saves far less. Assumption: spot costs 30 % of on-demand (a 70 % saving), and the
# interruptions it brings cost no extra time (checkpoints restore on the next instance).
SPOT_DISCOUNT = 0.70

# Instance types lmstack trains on whose SageMaker price could not be sourced (see above).
UNPRICED = ("ml.p5.4xlarge", "ml.p5e.48xlarge", "ml.p5en.48xlarge", "ml.p6-b200.48xlarge",
            "ml.g6.xlarge", "ml.g6.2xlarge", "ml.g6.4xlarge", "ml.g6.8xlarge", "ml.g6.16xlarge",
            "ml.g6.12xlarge", "ml.g6.24xlarge", "ml.g6.48xlarge",
            "ml.g6e.xlarge", "ml.g6e.2xlarge", "ml.g6e.4xlarge", "ml.g6e.8xlarge", "ml.g6e.16xlarge",
            "ml.g6e.12xlarge", "ml.g6e.24xlarge", "ml.g6e.48xlarge")


def get_gpu(name):
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError("unknown GPU %r; allowed: %s" % (name, ", ".join(GPUS)))


def on_demand_price(instance_type):
    """USD per instance-hour, or None for an instance type in UNPRICED."""
    if instance_type in UNPRICED:
        return None
    try:
        return ON_DEMAND_USD_PER_HOUR[instance_type]
    except KeyError:
        raise ValueError("no price for instance type %r; priced: %s" % (
            instance_type, ", ".join(ON_DEMAND_USD_PER_HOUR)))


def spot_cost(on_demand_usd):
    """What an on-demand cost becomes with managed spot, under the SPOT_DISCOUNT assumption."""
    return None if on_demand_usd is None else on_demand_usd * (1.0 - SPOT_DISCOUNT)


def auto_precision(gpu=None, capability=None):
    """What precision "auto" means: the GPU's default (bf16 on A100/H100, fp16 with loss scaling
    on V100/T4/A10G) for a GPU in GPUS; for another GPU, bf16 from compute capability 8.0 on,
    else fp16; fp32 without a GPU."""
    if gpu is not None:
        return get_gpu(gpu).default_precision
    if capability:
        return "bf16" if tuple(capability) >= (8, 0) else "fp16"
    return "fp32"
