"""The Hugging Face Llama layout of the llama family (`lm.models.llama`), for `lm.hf`: the directory
transformers loads as LlamaForCausalLM, and TGI and LMI (vLLM) serve.

    config.json         LlamaConfig: model_type llama, hidden_act silu, no biases, rope_theta,
                        rope_scaling (null or Llama 3.1/3.2's "llama3"), torch_dtype bfloat16
    model.safetensors   (or shards and model.safetensors.index.json) in bfloat16, as Meta publishes
                        Llama, unless asked otherwise;
                        PyTorch names: model.embed_tokens.weight, model.layers.N.input_layernorm.weight,
                        model.layers.N.self_attn.{q,k,v,o}_proj.weight,
                        model.layers.N.post_attention_layernorm.weight,
                        model.layers.N.mlp.{gate,up,down}_proj.weight, model.norm.weight,
                        lm_head.weight (absent when tied); nn.Linear weights are [out, in], the
                        transpose of our kernels
    tokenizer files     as lm.hf writes them, tokenizer_class PreTrainedTokenizerFast

lm.models.llama uses transformers' rotary convention (rotate_half over the two halves of each head), so
q_proj and k_proj map without the permutation Meta's original checkpoints need.
"""
import collections
import dataclasses
import functools

from lm.hf.files import HFError, Layout, Tensor, shared_hf_config
from lm.spec.families import LlamaConfig

EXPORT_DTYPE = "bfloat16"  # as Meta publishes Llama 2 and 3
NORM_WEIGHTS = {"input_layernorm": "attention_norm", "post_attention_layernorm": "mlp_norm"}
ATTENTION_KERNELS = {"q_proj": "q_kernel", "k_proj": "k_kernel", "v_proj": "v_kernel", "o_proj": "o_kernel"}
MLP_KERNELS = {"gate_proj": "gate_kernel", "up_proj": "up_kernel", "down_proj": "down_kernel"}


def variables(model):
    """Our Llama's variables by their LlamaForCausalLM state-dict name, in its order."""
    found = collections.OrderedDict([("model.embed_tokens.weight", model.embed_tokens.embeddings)])
    for i, block in enumerate(model.blocks):
        prefix = "model.layers.%d." % i
        for theirs, ours in NORM_WEIGHTS.items():
            found[prefix + theirs + ".weight"] = getattr(block, ours).weight
        for theirs, ours in ATTENTION_KERNELS.items():
            found[prefix + "self_attn." + theirs + ".weight"] = getattr(block.attention, ours)
        for theirs, ours in MLP_KERNELS.items():
            found[prefix + "mlp." + theirs + ".weight"] = getattr(block.mlp, ours)
    found["model.norm.weight"] = model.norm.weight
    if model.lm_head is not None:
        found["lm_head.weight"] = model.lm_head.kernel
    return found


def _transposed(name):
    """Linear weights (the projections and the head) are [out, in] in PyTorch, [in, out] here."""
    return name.endswith("_proj.weight") or name == "lm_head.weight"


def _exported(variable, transposed, rows):
    value = variable.numpy()
    value = value.T if transposed else value
    return value if rows is None else value[:rows]


def export_tensors(model, config):
    """{name: Tensor}: each variable read when it is written, transposed where PyTorch's layout is, the
    padded vocabulary rows cut."""
    found = collections.OrderedDict()
    for name, variable in variables(model).items():
        transposed = _transposed(name)
        shape = list(variable.shape)[::-1] if transposed else list(variable.shape)
        rows = config.vocab_size if name in ("model.embed_tokens.weight", "lm_head.weight") else None
        if rows is not None:
            shape[0] = rows
        found[name] = Tensor(tuple(shape), functools.partial(_exported, variable, transposed, rows))
    return found


def import_name(name, config):
    """The tensors export_tensors writes, and none of: older checkpoints' rotary frequencies, and the
    head of a tied checkpoint that stores it anyway (transformers ties it to the embedding)."""
    if name.endswith(".rotary_emb.inv_freq") or (name == "lm_head.weight" and config.tie_embeddings):
        return None
    return name


def import_value(name, value):
    return value.T if _transposed(name) else value


def check(config):
    """Every LlamaConfig is in the Llama layout."""


def hf_rope_scaling(scaling):
    """transformers' rope_scaling of a Llama3RopeScaling: its factors as floats, which transformers'
    rope validation requires (4.46.3, modeling_rope_utils.py lines 510-541: it warns at an int factor,
    and at original_max_position_embeddings not below max_position_embeddings, hence
    LlamaConfig.supported_context)."""
    if scaling is None:
        return None
    values = dataclasses.asdict(scaling)
    for name in ("factor", "low_freq_factor", "high_freq_factor"):
        values[name] = float(values[name])
    return values


def hf_config(config, eos_id, dtype=EXPORT_DTYPE):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.supported_context,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": hf_rope_scaling(config.rope_scaling),
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": config.dropout,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        **shared_hf_config(config, eos_id, dtype),
    }


REQUIRED_FIELDS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                   "max_position_embeddings", "vocab_size")


def read_config(path, values):
    """The LlamaConfig of config.json's `values` (read from `path`); HFError where lm.models.llama differs."""
    missing = [name for name in REQUIRED_FIELDS if name not in values]
    if missing:
        raise HFError("%s: model_type llama needs the fields %s" % (path, ", ".join(missing)))
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    refusals = [
        (values.get("hidden_act", "silu") != "silu", "hidden_act %r; lm.models.llama's MLP is SwiGLU (silu)"
         % values.get("hidden_act")),
        (values.get("attention_bias") or values.get("mlp_bias"), "attention_bias/mlp_bias true; lm.models.llama has no biases"),
        ((values.get("head_dim") or hidden // heads) * heads != hidden, "head_dim %r; lm.models.llama's is hidden_size / "
         "num_attention_heads" % values.get("head_dim")),
    ]
    problems = [message for refused, message in refusals if refused]
    if problems:
        raise HFError("%s: %s" % (path, "; ".join(problems)))
    try:
        return LlamaConfig(
            n_layer=values["num_hidden_layers"], d_model=hidden, n_head=heads,
            n_kv_head=values.get("num_key_value_heads") or heads, d_ff=values["intermediate_size"],
            block_size=values["max_position_embeddings"], vocab_size=values["vocab_size"], pad_vocab_to=1,
            dropout=values.get("attention_dropout", 0.0), rope_theta=values.get("rope_theta", 10000.0),
            rope_scaling=values.get("rope_scaling"),
            norm_eps=values.get("rms_norm_eps", 1e-6), tie_embeddings=values.get("tie_word_embeddings", False))
    except ValueError as error:
        raise HFError("%s: %s" % (path, error))


LAYOUT = Layout(model_type="llama", tokenizer_class="PreTrainedTokenizerFast", export_dtype=EXPORT_DTYPE,
                shape_fields=("n_layer", "d_model", "n_head", "n_kv_head", "d_ff"), check=check, hf_config=hf_config,
                read_config=read_config, export_tensors=export_tensors, import_name=import_name,
                import_value=import_value, variables=variables)
