"""The serving containers a deployment may choose (`deploy.container`), in one place.

- `lmstack`: our own server (`lm.serve`) in the training image; serves the `lm.export` files.
- `tgi`: Hugging Face Text Generation Inference on SageMaker (the Hugging Face LLM DLC,
  repository `huggingface-pytorch-tgi-inference`); serves the Hugging Face export that
  `lm.train` writes next to ours when `hyperparameters.export_hf` is true (config.json,
  model.safetensors, tokenizer files: `lm.hf`), at the top of /opt/ml/model.

TGI's SageMaker entrypoint reads HF_MODEL_ID (a hub id or a local directory) and SM_NUM_GPUS
(the tensor-parallel shards), and the launcher's MAX_INPUT_LENGTH / MAX_TOTAL_TOKENS (prompt
tokens, prompt + generated tokens per request) and DTYPE (TGI docs, "Text-generation-launcher
arguments": each option's `[env: ...]`). Tensor parallelism splits the attention heads, so the
shard count divides n_head.

Image table: TGI_IMAGES, taken on TGI_IMAGES_TAKEN from the SageMaker Python SDK's
`src/sagemaker/image_uri_config/huggingface-llm.json` (versions 3.0.1, added by commit
6593c69 "add new images for HF TGI (#5005)"; 2.0.2 from the file itself) and checked against
the Hugging Face hub-docs page "Text Generation Inference (TGI) Images" (docs/sagemaker/tgi.md,
`2.4.0-tgi3.0.1-gpu-py311-cu124-ubuntu22.04`). The SDK builds the URI as
`<registry>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag_prefix>-gpu-<py>-<container_version>`.

Pure Python 3.8, no TensorFlow: read at synth time by the state machine and `lm.rules`.
"""
import collections

from lm.instances import INSTANCES

LMSTACK = "lmstack"
TGI = "tgi"
CONTAINERS = (LMSTACK, TGI)
DEFAULT_CONTAINER = LMSTACK

TGI_REPOSITORY = "huggingface-pytorch-tgi-inference"
TGI_IMAGES_TAKEN = "2026-12-04"
# version -> tag; the SDK's registries for these versions: 763104351884 in every region lmstack
# deploys to (stacks.config.REGIONS).
TGI_TAGS = collections.OrderedDict([
    ("3.0.1", "2.4.0-tgi3.0.1-gpu-py311-cu124-ubuntu22.04"),
    ("2.0.2", "2.3.0-tgi2.0.2-gpu-py310-cu121-ubuntu22.04"),
])
TGI_REGISTRIES = collections.OrderedDict([
    ("us-east-1", "763104351884"), ("us-east-2", "763104351884"), ("us-west-2", "763104351884"),
    ("eu-west-1", "763104351884"), ("ap-northeast-1", "763104351884"),
])
TGI_VERSION = "3.0.1"
TGI_IMAGES = collections.OrderedDict(
    ((region, version), "%s.dkr.ecr.%s.amazonaws.com/%s:%s" % (account, region, TGI_REPOSITORY, tag))
    for region, account in TGI_REGISTRIES.items() for version, tag in TGI_TAGS.items())

# The container's own file system path of the model data (SageMaker extracts model.tar.gz there).
MODEL_PATH = "/opt/ml/model"
# The export is float32; the launcher's --dtype (env DTYPE) makes TGI load it as float16 (T4 and
# V100 have no bfloat16), which the memory estimate assumes for weights and KV cache.
TGI_DTYPE = "float16"
SERVING_BYTES = 2
# CUDA context, TGI's warm-up prefill buffers and fragmentation, per GPU (an estimate: TGI
# measures the rest at start-up and fails if one MAX_TOTAL_TOKENS sequence does not fit).
OVERHEAD_GIB = 2.0
USABLE_FRACTION = 0.9


def tgi_image(region, version=TGI_VERSION):
    try:
        return TGI_IMAGES[(region, version)]
    except KeyError:
        raise ValueError("no TGI image for region %r version %r; the table has regions %s, versions %s" % (
            region, version, ", ".join(TGI_REGISTRIES), ", ".join(TGI_TAGS)))


def token_limits(config):
    """(MAX_INPUT_LENGTH, MAX_TOTAL_TOKENS): the whole context per request, half of it prompt."""
    return config.block_size // 2, config.block_size


def serving_parameters(config):
    """Parameters of the served Hugging Face model: the padded embedding rows are cut (lm.hf)."""
    embeddings = config.vocab_size * config.d_model + config.block_size * config.d_model
    per_block = 12 * config.d_model * config.d_model + 13 * config.d_model
    return embeddings + config.n_layer * per_block + 2 * config.d_model


def memory_per_gpu_gib(config, shards):
    """Weights and one MAX_TOTAL_TOKENS sequence's KV cache, split over `shards`, plus overhead."""
    _, total_tokens = token_limits(config)
    weights = serving_parameters(config) * SERVING_BYTES
    kv_cache = 2 * config.n_layer * config.d_model * total_tokens * SERVING_BYTES
    return (weights + kv_cache) / shards / 2 ** 30 + OVERHEAD_GIB


def tgi_shards(config, instance_type):
    """(SM_NUM_GPUS, None), or (None, why TGI cannot serve `config` on `instance_type`): the
    fewest GPUs (a divisor of n_head) whose memory holds the model."""
    instance = INSTANCES[instance_type]
    if config.family != "gpt":
        return None, "TGI serves the GPT-2 export; family %s has none" % config.family
    if not instance.gpus:
        return None, "TGI needs a GPU instance; %s has none" % instance_type
    usable = instance.gpu_memory_gib * USABLE_FRACTION
    for shards in range(1, instance.gpus + 1):
        if config.n_head % shards == 0 and memory_per_gpu_gib(config, shards) <= usable:
            return shards, None
    most = max(s for s in range(1, instance.gpus + 1) if config.n_head % s == 0)
    return None, "needs %.1f GiB per GPU on %d GPUs, %s has %.1f usable per GPU" % (
        memory_per_gpu_gib(config, most), most, instance_type, usable)


def tgi_environment(config, shards):
    """The Environment of the TGI model (every value a string, as CreateModel requires)."""
    max_input, max_total = token_limits(config)
    return collections.OrderedDict([
        ("HF_MODEL_ID", MODEL_PATH),
        ("SM_NUM_GPUS", str(shards)),
        ("MAX_INPUT_LENGTH", str(max_input)),
        ("MAX_TOTAL_TOKENS", str(max_total)),
        ("DTYPE", TGI_DTYPE),
    ])
