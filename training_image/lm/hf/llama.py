"""The Hugging Face Llama layout of the llama family (`lm.models.llama`), for `lm.hf`: the directory
transformers loads as LlamaForCausalLM / FlaxLlamaForCausalLM, and TGI and LMI (vLLM) serve.

    config.json         LlamaConfig: model_type llama, hidden_act silu, no biases, rope_theta
    model.safetensors   PyTorch names: model.embed_tokens.weight, model.layers.N.input_layernorm.weight,
                        model.layers.N.self_attn.{q,k,v,o}_proj.weight,
                        model.layers.N.post_attention_layernorm.weight,
                        model.layers.N.mlp.{gate,up,down}_proj.weight, model.norm.weight,
                        lm_head.weight (absent when tied); nn.Linear weights are [out, in], the
                        transpose of our kernels
    tokenizer files     as lm.hf writes them, tokenizer_class PreTrainedTokenizerFast

lm.models.llama uses transformers' rotary convention (rotate_half over the two halves of each head), so
q_proj and k_proj map without the permutation Meta's original checkpoints need.
"""
from lm.hf.files import HFError, Layout, shared_hf_config
from lm.spec.families import LlamaConfig

NORM_WEIGHTS = {"input_layernorm": "attention_norm", "post_attention_layernorm": "mlp_norm"}
ATTENTION_KERNELS = {"q_proj": "q_kernel", "k_proj": "k_kernel", "v_proj": "v_kernel", "o_proj": "o_kernel"}
MLP_KERNELS = {"gate_proj": "gate_kernel", "up_proj": "up_kernel", "down_proj": "down_kernel"}


def variables(model):
    """Our Llama's variables by their LlamaForCausalLM state-dict name."""
    found = {"model.embed_tokens.weight": model.embed_tokens.embeddings, "model.norm.weight": model.norm.weight}
    if model.lm_head is not None:
        found["lm_head.weight"] = model.lm_head.kernel
    for i, block in enumerate(model.blocks):
        prefix = "model.layers.%d." % i
        for theirs, ours in NORM_WEIGHTS.items():
            found[prefix + theirs + ".weight"] = getattr(block, ours).weight
        for theirs, ours in ATTENTION_KERNELS.items():
            found[prefix + "self_attn." + theirs + ".weight"] = getattr(block.attention, ours)
        for theirs, ours in MLP_KERNELS.items():
            found[prefix + "mlp." + theirs + ".weight"] = getattr(block.mlp, ours)
    return found


def _transposed(name):
    """Linear weights (the projections and the head) are [out, in] in PyTorch, [in, out] here."""
    return name.endswith("_proj.weight") or name == "lm_head.weight"


def export_tensors(model, config):
    tensors = {name: variable.numpy() for name, variable in variables(model).items()}
    tensors = {name: value.T if _transposed(name) else value for name, value in tensors.items()}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in tensors:
            tensors[name] = tensors[name][:config.vocab_size]  # the padded rows
    return tensors


def import_tensors(tensors):
    """The tensors export_tensors writes, in our orientation."""
    return {name: value.T if _transposed(name) else value for name, value in tensors.items()
            if not name.endswith(".rotary_emb.inv_freq")}  # older checkpoints store the rotary frequencies


def check(config):
    """Every LlamaConfig is in the Llama layout."""


def hf_config(config, eos_id):
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
        "max_position_embeddings": config.block_size,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": config.dropout,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        **shared_hf_config(config, eos_id),
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
        (values.get("rope_scaling") is not None, "rope_scaling %r; lm.models.llama implements unscaled rotary embeddings "
         "(rope_scaling null)" % (values.get("rope_scaling"),)),
        (values.get("head_dim", hidden // heads) * heads != hidden, "head_dim %r; lm.models.llama's is hidden_size / "
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
            norm_eps=values.get("rms_norm_eps", 1e-6), tie_embeddings=values.get("tie_word_embeddings", False))
    except ValueError as error:
        raise HFError("%s: %s" % (path, error))


LAYOUT = Layout(model_type="llama", tokenizer_class="PreTrainedTokenizerFast",
                shape_fields=("n_layer", "d_model", "n_head", "n_kv_head", "d_ff"), check=check, hf_config=hf_config,
                read_config=read_config, export_tensors=export_tensors, import_tensors=import_tensors,
                variables=variables)
