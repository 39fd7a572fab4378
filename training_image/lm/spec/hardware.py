"""The hardware lmstack knows: SageMaker instance types (accelerators, memory, interconnect)
and their GPUs (peak FLOP/s per precision, the precision "auto" means, the CUDA they need).

Read by the planner (`controlplane.planner`), the CDK app's input validation and the runtime
(`lm.training.train`: MFU and the "auto" precision). What only the control plane reads is there: which
types can host an endpoint (`controlplane.containers`), the network between hosts and the MFU the
planner assumes (`controlplane.throughput`). Every number here is a published figure or
a stated assumption; change it here and nowhere else. Prices are the control plane's
(`controlplane.prices`). Pure Python 3.8, no TensorFlow.
"""
import collections

Instance = collections.namedtuple("Instance", "name gpus gpu gpu_memory_gib vcpus memory_gib interconnect")

_ROWS = [
    # name, GPUs, GPU model, GiB per GPU, vCPUs, host GiB, interconnect between hosts
    ("ml.m5.xlarge", 0, None, 0, 4, 16, "ethernet"),
    ("ml.m5.4xlarge", 0, None, 0, 16, 64, "ethernet"),
    ("ml.c5.18xlarge", 0, None, 0, 72, 144, "ethernet"),
    ("ml.g4dn.12xlarge", 4, "T4", 16, 48, 192, "ethernet"),
    ("ml.g5.xlarge", 1, "A10G", 24, 4, 16, "ethernet"),
    ("ml.g5.2xlarge", 1, "A10G", 24, 8, 32, "ethernet"),
    ("ml.g5.12xlarge", 4, "A10G", 24, 48, 192, "ethernet"),
    ("ml.g5.24xlarge", 4, "A10G", 24, 96, 384, "ethernet"),
    ("ml.g5.48xlarge", 8, "A10G", 24, 192, 768, "ethernet"),
    ("ml.p3.2xlarge", 1, "V100", 16, 8, 61, "ethernet"),
    ("ml.p3.8xlarge", 4, "V100", 16, 32, 244, "ethernet"),
    ("ml.p3.16xlarge", 8, "V100", 16, 64, 488, "ethernet"),
    ("ml.p3dn.24xlarge", 8, "V100", 32, 96, 768, "efa"),
    ("ml.p4d.24xlarge", 8, "A100", 40, 96, 1152, "efa"),
    ("ml.p4de.24xlarge", 8, "A100", 80, 96, 1152, "efa"),
    ("ml.p5.48xlarge", 8, "H100", 80, 192, 2048, "efa"),
    # Added 2026-12 from botocore's TrainingInstanceType enum; sizes from the EC2 instance type
    # pages (accelerated computing: G6, G6e, P5/P5e/P5en, P6-B200), as of 2026-12.
    ("ml.p5.4xlarge", 1, "H100", 80, 16, 256, "efa"),  # one H100: the cheap smoke run
    ("ml.p5e.48xlarge", 8, "H200", 141, 192, 2048, "efa"),
    ("ml.p5en.48xlarge", 8, "H200", 141, 192, 2048, "efa"),
    ("ml.p6-b200.48xlarge", 8, "B200", 179, 192, 2048, "efa"),
    ("ml.g6.xlarge", 1, "L4", 24, 4, 16, "ethernet"),
    ("ml.g6.2xlarge", 1, "L4", 24, 8, 32, "ethernet"),
    ("ml.g6.4xlarge", 1, "L4", 24, 16, 64, "ethernet"),
    ("ml.g6.8xlarge", 1, "L4", 24, 32, 128, "ethernet"),
    ("ml.g6.16xlarge", 1, "L4", 24, 64, 256, "ethernet"),
    ("ml.g6.12xlarge", 4, "L4", 24, 48, 192, "ethernet"),
    ("ml.g6.24xlarge", 4, "L4", 24, 96, 384, "ethernet"),
    ("ml.g6.48xlarge", 8, "L4", 24, 192, 768, "ethernet"),
    ("ml.g6e.xlarge", 1, "L40S", 48, 4, 32, "ethernet"),
    ("ml.g6e.2xlarge", 1, "L40S", 48, 8, 64, "ethernet"),
    ("ml.g6e.4xlarge", 1, "L40S", 48, 16, 128, "ethernet"),
    ("ml.g6e.8xlarge", 1, "L40S", 48, 32, 256, "ethernet"),
    ("ml.g6e.16xlarge", 1, "L40S", 48, 64, 512, "ethernet"),
    ("ml.g6e.12xlarge", 4, "L40S", 48, 48, 384, "ethernet"),
    ("ml.g6e.24xlarge", 4, "L40S", 48, 96, 768, "ethernet"),
    ("ml.g6e.48xlarge", 8, "L40S", 48, 192, 1536, "ethernet"),
]

INSTANCES = collections.OrderedDict((row[0], Instance(*row)) for row in _ROWS)


def get_instance(name):
    try:
        return INSTANCES[name]
    except KeyError:
        raise ValueError("unknown instance type %r; allowed: %s" % (name, ", ".join(INSTANCES)))


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
    # A10G: Ampere (sm_86) tensor cores run bf16 at the fp16 rate (A10 data sheet), so it defaults
    # to bf16 as the A100 does: no loss scaling, the range of fp32.
    GPU("A10G", "ampere", {"fp32": 62.5 * _T, "fp16": 125 * _T, "bf16": 125 * _T}, "bf16", (11, 1)),
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
# The default precision per GPU is the one `lm.training.train --precision auto` picks (lm.spec.job's help text).



def get_gpu(name):
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError("unknown GPU %r; allowed: %s" % (name, ", ".join(GPUS)))


def auto_precision(gpu=None, capability=None):
    """What precision "auto" means: the GPU's default (bf16 from Ampere on: A10G, A100, H100 ...;
    fp16 with loss scaling on V100/T4) for a GPU in GPUS; for another GPU, bf16 from compute capability 8.0 on,
    else fp16; fp32 without a GPU."""
    if gpu is not None:
        return get_gpu(gpu).default_precision
    if capability:
        return "bf16" if tuple(capability) >= (8, 0) else "fp16"
    return "fp32"
