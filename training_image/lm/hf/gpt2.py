"""The Hugging Face GPT-2 layout of the gpt family (`lm.models.gpt`), for `lm.hf`: the directory
`transformers` loads as GPT2LMHeadModel / TFGPT2LMHeadModel, and TGI and LMI (vLLM) serve.

    config.json             GPT2Config (activation gelu_new = our GELU tanh approximation)
    model.safetensors       the PyTorch GPT-2 tensor names and layout: Conv1D weights stored
                            [in, out], which is our kernels' layout, so no transpose; float32, as
                            OpenAI's GPT-2 is published, unless asked otherwise
    tokenizer files         as lm.hf writes them, tokenizer_class GPT2TokenizerFast
"""
import collections

from lm.hf.files import HFError, Layout, Tensor, shared_hf_config
from lm.spec.families import GPTConfig

LAYER_NORM_EPSILON = 1e-5
EXPORT_DTYPE = "float32"  # as OpenAI's GPT-2 is published


def check(config):
    problems = []
    if config.norm != "pre":
        problems.append("norm=%r (GPT-2 is 'pre')" % config.norm)
    if config.activation != "gelu":
        problems.append("activation=%r (GPT-2 is 'gelu')" % config.activation)
    if not config.tie_embeddings:
        problems.append("tie_embeddings=False (GPT-2 ties them)")
    if config.attention_head_dim * config.n_head != config.d_model:
        problems.append("head_dim=%r (GPT-2 is d_model // n_head)" % config.head_dim)
    if problems:
        raise HFError("this gpt config is not GPT-2: %s" % "; ".join(problems))


def variables(model):
    """Our GPT's variables by their GPT-2 name (as in GPT2Model's state dict, in its order)."""
    found = collections.OrderedDict([("wte.weight", model.embedding.token_table),
                                     ("wpe.weight", model.embedding.position_table)])
    for i, block in enumerate(model.blocks):
        attention, mlp = block.attention, block.mlp
        for name, variable in [
                ("ln_1.weight", block.ln_1.gamma), ("ln_1.bias", block.ln_1.beta),
                ("ln_2.weight", block.ln_2.gamma), ("ln_2.bias", block.ln_2.beta),
                ("attn.c_attn.weight", attention.qkv_kernel), ("attn.c_attn.bias", attention.qkv_bias),
                ("attn.c_proj.weight", attention.output_kernel), ("attn.c_proj.bias", attention.output_bias),
                ("mlp.c_fc.weight", mlp.fc_kernel), ("mlp.c_fc.bias", mlp.fc_bias),
                ("mlp.c_proj.weight", mlp.proj_kernel), ("mlp.c_proj.bias", mlp.proj_bias)]:
            found["h.%d.%s" % (i, name)] = variable
    found.update([("ln_f.weight", model.ln_f.gamma), ("ln_f.bias", model.ln_f.beta)])
    return found


def export_tensors(model, config):
    """The PyTorch GPT2LMHeadModel state dict (without the tied lm_head) of our GPT model as
    {name: Tensor}, each variable read when it is written, padded vocabulary rows cut."""
    found = collections.OrderedDict()
    for name, variable in variables(model).items():
        shape = list(variable.shape)
        rows = config.vocab_size if name == "wte.weight" else None
        if rows is not None:
            shape[0] = rows
        found["transformer." + name] = Tensor(
            tuple(shape), lambda variable=variable, rows=rows: variable.numpy()[:rows])
    return found


def gpt2_config(config, eos_id, dtype=EXPORT_DTYPE):
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_ctx": config.block_size,
        "n_embd": config.d_model,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": LAYER_NORM_EPSILON,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        **shared_hf_config(config, eos_id, dtype),
    }


def read_config(path, values):
    """The GPTConfig of config.json's `values` (read from `path`); HFError where lmstack's GPT differs."""
    if values.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise HFError("%s: activation_function %r; lmstack's GELU is the tanh approximation "
                      "(gelu_new)" % (path, values.get("activation_function")))
    if values.get("n_inner") not in (None, 4 * values["n_embd"]):
        raise HFError("%s: n_inner %r; lmstack's MLP is 4 * n_embd" % (path, values.get("n_inner")))
    if not values.get("tie_word_embeddings", True):
        raise HFError("%s: tie_word_embeddings false; lmstack imports tied GPT-2 only" % path)
    for field in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if values.get(field):
            raise HFError("%s: %s true is not supported" % (path, field))
    if abs(values.get("layer_norm_epsilon", LAYER_NORM_EPSILON) - LAYER_NORM_EPSILON) > 1e-12:
        raise HFError("%s: layer_norm_epsilon %r; lmstack uses %g" % (
            path, values.get("layer_norm_epsilon"), LAYER_NORM_EPSILON))
    return GPTConfig(n_layer=values["n_layer"], d_model=values["n_embd"], n_head=values["n_head"],
                     block_size=values["n_positions"], vocab_size=values["vocab_size"], pad_vocab_to=1,
                     dropout=values.get("resid_pdrop", 0.0))


def import_name(name, config):
    """The GPT2Model state-dict name of a tensor as GPT2LMHeadModel, GPT2Model or
    TFGPT2LMHeadModel.save_pretrained names it ("transformer/h_._0/ln_1/gamma:0": TF names); None for
    the causal masks and the tied head."""
    if "/" in name:
        name = name.split(":")[0].replace("/", ".").replace("h_._", "h.")
        name = name.replace(".gamma", ".weight").replace(".beta", ".bias").replace(".embeddings", ".weight")
    if name.startswith("transformer."):
        name = name[len("transformer."):]
    return None if name.endswith(".attn.bias") or name == "lm_head.weight" else name


def import_value(name, value):
    """TF checkpoints store biases as [1, n]."""
    return value[0] if name.endswith(".bias") and value.ndim == 2 and value.shape[0] == 1 else value


LAYOUT = Layout(model_type="gpt2", tokenizer_class="GPT2TokenizerFast", export_dtype=EXPORT_DTYPE,
                shape_fields=("n_layer", "d_model", "n_head"), check=check, hf_config=gpt2_config,
                read_config=read_config, export_tensors=export_tensors, import_name=import_name,
                import_value=import_value, variables=variables)
