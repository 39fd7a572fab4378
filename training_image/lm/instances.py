"""SageMaker instance types lmstack knows: accelerators, memory, interconnect.

One table, read by the planner (`lm.plan`), the job seam and the CDK app's input
validation. Prices and peak FLOP/s are added by `lm.plan`'s data (see there for sources).
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

# Types SageMaker trains on but cannot host: CreateEndpointConfig's ProductionVariantInstanceType
# (botocore's sagemaker service model) has no such value, so an endpoint on one fails only after
# training. tests/test_instances.py checks this split against that enum.
TRAINING_ONLY = ("ml.p3dn.24xlarge",)
HOSTING_INSTANCE_TYPES = tuple(name for name in INSTANCES if name not in TRAINING_ONLY)


def get_instance(name):
    try:
        return INSTANCES[name]
    except KeyError:
        raise ValueError("unknown instance type %r; allowed: %s" % (name, ", ".join(INSTANCES)))

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
