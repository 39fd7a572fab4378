"""The serving containers a deployment may choose (`deploy.container`), in one place.

- `lmstack`: our own server (`lm.serving.server`) in the training image; serves the `lm.serving.export` files.
- `tgi`: Hugging Face Text Generation Inference on SageMaker (the Hugging Face LLM DLC,
  repository `huggingface-pytorch-tgi-inference`); serves the Hugging Face export that
  `lm.training.train` writes next to ours when `hyperparameters.export_hf` is true (config.json,
  model.safetensors, tokenizer files: `lm.hf`), at the top of /opt/ml/model.

TGI's SageMaker entrypoint reads HF_MODEL_ID (a hub id or a local directory) and SM_NUM_GPUS
(the tensor-parallel shards), and the launcher's MAX_INPUT_LENGTH / MAX_TOTAL_TOKENS (prompt
tokens, prompt + generated tokens per request) and DTYPE (TGI docs, "Text-generation-launcher
arguments": each option's `[env: ...]`). Tensor parallelism splits the attention heads, so the
shard count divides n_head, and the key/value heads of grouped-query attention (Llama's n_kv_head)
alike: TGI's and vLLM's sharded attention layers split both by the shard count.

Image table: TGI_TAGS and TGI_REGISTRIES, taken on TGI_IMAGES_TAKEN from the SageMaker Python SDK's
`src/sagemaker/image_uri_config/huggingface-llm.json` (versions 3.0.1, added by commit
6593c69 "add new images for HF TGI (#5005)"; 2.0.2 from the file itself) and checked against
the Hugging Face hub-docs page "Text Generation Inference (TGI) Images" (docs/sagemaker/tgi.md,
`2.4.0-tgi3.0.1-gpu-py311-cu124-ubuntu22.04`). The SDK builds the URI as
`<registry>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag_prefix>-gpu-<py>-<container_version>`.

- `lmi`: AWS's Large Model Inference container (repository `djl-inference`, DJL Serving with
  vLLM as the engine), TGI's successor on SageMaker, on the same Hugging Face export. Its
  environment (LMI docs, djl-serving `serving/docs/lmi/deployment_guide/configurations.md` and
  `user_guides/vllm_user_guide.md`): every `option.<name>` of serving.properties may be given as
  `OPTION_<NAME>`; OPTION_MODEL_ID the model (here SageMaker's model directory),
  OPTION_ROLLING_BATCH `vllm` the engine, OPTION_TENSOR_PARALLEL_DEGREE the GPUs one model copy
  is split over (a number: LMI starts as many copies as the instance's GPUs allow),
  OPTION_DTYPE `fp16`, and vLLM's engine arguments pass through the same way
  (OPTION_MAX_MODEL_LEN: vLLM's max_model_len, prompt + generated tokens). vLLM reserves
  gpu_memory_utilization (0.9 by default) of each GPU and fails at start-up if one
  max_model_len sequence does not fit: the same estimate as TGI's (`memory_per_gpu_gib`).

Image table: LMI_TAGS, taken on LMI_IMAGES_TAKEN from the SageMaker Python SDK 2.257.7's
`sagemaker/image_uri_config/djl-lmi.json` (scope inference, `latest` alias 0.38.0; registries
763104351884 in our regions), URI `<registry>.dkr.ecr.<region>.amazonaws.com/djl-inference:<tag_prefix>`
as `sagemaker.image_uris.retrieve("djl-lmi", region, version)` returns it.

Which model families each of them can serve: the families' declared capabilities `tgi` and `lmi`
(`lm.spec.families.CAPABILITIES`; the capability is named as the container).

Pure Python 3.8, no TensorFlow: read at synth time by the state machine and `controlplane.rules`.
"""
import collections

from lm.spec.families import capability_message, get_family
from lm.spec.hardware import INSTANCES

LMSTACK = "lmstack"
TGI = "tgi"
LMI = "lmi"
CONTAINERS = (LMSTACK, TGI, LMI)
# The containers that serve the Hugging Face export; a family serves in one when it declares the
# capability of that name.
HF_CONTAINERS = (TGI, LMI)
DEFAULT_CONTAINER = LMSTACK

# Types SageMaker trains on but cannot host: CreateEndpointConfig's ProductionVariantInstanceType
# (botocore's sagemaker service model) has no such value, so an endpoint on one fails only after
# training. tests/state_machine/test_validation.py checks this split against that enum.
TRAINING_ONLY = ("ml.p3dn.24xlarge",)
HOSTING_INSTANCE_TYPES = tuple(name for name in INSTANCES if name not in TRAINING_ONLY)

TGI_REPOSITORY = "huggingface-pytorch-tgi-inference"
TGI_IMAGES_TAKEN = "2026-12-04"
# version -> tag; the SDK's registries for these versions: 763104351884 in every region lmstack
# deploys to (stacks.settings.REGIONS).
TGI_TAGS = collections.OrderedDict([
    ("3.0.1", "2.4.0-tgi3.0.1-gpu-py311-cu124-ubuntu22.04"),
    ("2.0.2", "2.3.0-tgi2.0.2-gpu-py310-cu121-ubuntu22.04"),
])
TGI_REGISTRIES = collections.OrderedDict([
    ("us-east-1", "763104351884"), ("us-east-2", "763104351884"), ("us-west-2", "763104351884"),
    ("eu-west-1", "763104351884"), ("ap-northeast-1", "763104351884"),
])
TGI_VERSION = "3.0.1"

LMI_REPOSITORY = "djl-inference"
LMI_IMAGES_TAKEN = "2026-12-05"
LMI_TAGS = collections.OrderedDict([
    ("0.38.0", "0.38.0-lmi29.0.0-cu130"),
    ("0.36.0", "0.36.0-lmi27.0.0-cu130"),
])
LMI_REGISTRIES = TGI_REGISTRIES  # the same account, 763104351884, in each of our regions
LMI_VERSION = "0.38.0"

# container -> (repository, version -> tag, region -> account, default version)
IMAGE_TABLES = collections.OrderedDict([
    (TGI, (TGI_REPOSITORY, TGI_TAGS, TGI_REGISTRIES, TGI_VERSION)),
    (LMI, (LMI_REPOSITORY, LMI_TAGS, LMI_REGISTRIES, LMI_VERSION)),
])

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


def image(container, region, version=None):
    """The image URI of `container` (tgi or lmi) in `region`, at `version` (default: the newest)."""
    repository, tags, registries, default_version = IMAGE_TABLES[container]
    version = default_version if version is None else version
    if region not in registries or version not in tags:
        raise ValueError("no %s image for region %r version %r; the table has regions %s, versions %s" % (
            container.upper(), region, version, ", ".join(registries), ", ".join(tags)))
    return "%s.dkr.ecr.%s.amazonaws.com/%s:%s" % (registries[region], region, repository, tags[version])


def token_limits(config):
    """(MAX_INPUT_LENGTH, MAX_TOTAL_TOKENS): the whole context per request, half of it prompt."""
    return config.block_size // 2, config.block_size


def serving_parameters(config):
    """Parameters of the served Hugging Face model, of any family: the padded embedding rows (and
    output rows, when untied) are cut (lm.hf)."""
    padding = (config.padded_vocab_size - config.vocab_size) * config.d_model
    return config.parameter_count() - padding * (1 if config.tie_embeddings else 2)


def key_value_heads(config):
    """The heads the KV cache holds and tensor parallelism splits: grouped-query attention (family
    llama) shares n_kv_head of them among the n_head query heads; GPT has n_head."""
    return getattr(config, "n_kv_head", config.n_head)


def memory_per_gpu_gib(config, shards):
    """Weights and one MAX_TOTAL_TOKENS sequence's KV cache (keys and values of the key/value
    heads, every layer), split over `shards`, plus overhead."""
    _, total_tokens = token_limits(config)
    weights = serving_parameters(config) * SERVING_BYTES
    kv_width = key_value_heads(config) * (config.d_model // config.n_head)
    kv_cache = 2 * config.n_layer * kv_width * total_tokens * SERVING_BYTES
    return (weights + kv_cache) / shards / 2 ** 30 + OVERHEAD_GIB


def gpu_shards(container, config, instance_type):
    """(tensor-parallel GPUs, None), or (None, why `container` (tgi or lmi) cannot serve `config`
    on `instance_type`): the fewest GPUs (a divisor of n_head and of the key/value heads, which TGI
    and vLLM shard alike) whose memory holds the model."""
    instance = INSTANCES[instance_type]
    if not get_family(config.family).supports(container):
        return None, capability_message(config.family, "deploy.container %s" % container, container)
    if not instance.gpus:
        return None, "%s needs a GPU instance; %s has none" % (container.upper(), instance_type)
    usable = instance.gpu_memory_gib * USABLE_FRACTION
    for shards in range(1, instance.gpus + 1):
        if splits_heads(config, shards) and memory_per_gpu_gib(config, shards) <= usable:
            return shards, None
    most = max(s for s in range(1, instance.gpus + 1) if splits_heads(config, s))
    return None, "needs %.1f GiB per GPU on %d GPUs, %s has %.1f usable per GPU" % (
        memory_per_gpu_gib(config, most), most, instance_type, usable)


def splits_heads(config, shards):
    return config.n_head % shards == 0 and key_value_heads(config) % shards == 0


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


LMI_DTYPE = "fp16"  # LMI's name for TGI_DTYPE


def lmi_environment(config, shards):
    """The Environment of the LMI model: vLLM on the export, one sequence of the whole context."""
    _, max_total = token_limits(config)
    return collections.OrderedDict([
        ("OPTION_MODEL_ID", MODEL_PATH),
        ("OPTION_ROLLING_BATCH", "vllm"),
        ("OPTION_TENSOR_PARALLEL_DEGREE", str(shards)),
        ("OPTION_MAX_MODEL_LEN", str(max_total)),
        ("OPTION_DTYPE", LMI_DTYPE),
    ])


ENVIRONMENTS = {TGI: tgi_environment, LMI: lmi_environment}


def environment(container, config, shards):
    return ENVIRONMENTS[container](config, shards)
