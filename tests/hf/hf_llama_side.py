"""Run by tests/hf/test_hf_llama.py with .venv-hf's interpreter: transformers 4.46's own Llama
(FlaxLlamaForCausalLM on jax/flax CPU; the TF classes have no Llama, and no PyTorch is installed)
loads what `python -m lm.hf --format hf` wrote, or makes a random Llama checkpoint; prints JSON.

Two things FlaxLlamaForCausalLM 4.46.3 does not read from config.json, which transformers'
PyTorch LlamaForCausalLM (what TGI and vLLM follow) does, are applied here as PyTorch applies them:
rope_theta (the Flax class computes its sin/cos table with base 10000; `rope_theta` patches that
constant of its own create_sinusoidal_positions) and tie_word_embeddings (the Flax head is always
a Dense of its own; a tied checkpoint has no lm_head.weight, and the head gets the embedding,
as PyTorch's tie_weights gives it).
"""
import json
import sys

import numpy as np


def _flax_llama(rope_theta):
    import jax.numpy as jnp
    from transformers.models.llama import modeling_flax_llama

    def create_sinusoidal_positions(num_pos, dim):  # the library's function, base rope_theta instead of 10000
        inv_freq = 1.0 / (rope_theta ** (np.arange(0, dim, 2) / dim))
        freqs = np.einsum("i , j -> i j", np.arange(num_pos), inv_freq).astype("float32")
        emb = np.concatenate((freqs, freqs), axis=-1)
        out = np.concatenate((np.sin(emb)[:, None, :], np.cos(emb)[:, None, :]), axis=-1)
        return jnp.array(out[:, :, :num_pos])

    if rope_theta != 10000.0:
        modeling_flax_llama.create_sinusoidal_positions = create_sinusoidal_positions
    return modeling_flax_llama.FlaxLlamaForCausalLM


def _tie(model):
    params = model.params
    params["lm_head"]["kernel"] = params["model"]["embed_tokens"]["embedding"].T
    model.params = params


def _loading_info(model, hf_dir):
    """(parameters the checkpoint lacks, tensors the model does not use), by the names transformers'
    own PyTorch-to-Flax conversion gives the tensors (FlaxPreTrainedModel.from_pretrained has no
    output_loading_info; it logs these lists)."""
    import os

    from flax.traverse_util import flatten_dict
    from safetensors.numpy import load_file
    from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax

    converted = set(flatten_dict(convert_pytorch_state_dict_to_flax(
        load_file(os.path.join(hf_dir, "model.safetensors")), model)))
    expected = set(flatten_dict(model.params))
    return sorted(".".join(key) for key in expected - converted), sorted(".".join(key) for key in converted - expected)


def export_check(hf_dir, inputs_file):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(hf_dir)
    inputs = np.load(inputs_file)
    model = _flax_llama(config.rope_theta).from_pretrained(hf_dir)
    missing, unexpected = _loading_info(model, hf_dir)
    if config.tie_word_embeddings:
        _tie(model)
    logits = np.asarray(model(inputs["batch"]).logits)
    model.generation_config.eos_token_id = None  # 32 tokens on both sides, as lm.serving.generate without stops
    generated = np.asarray(model.generate(inputs["prompts"], max_new_tokens=32, do_sample=False,
                                          pad_token_id=0).sequences)[:, inputs["prompts"].shape[1]:]
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    np.savez(inputs_file + ".hf.npz", logits=logits, generated=generated)
    print(json.dumps({
        "class": type(model).__name__, "tokenizer_class": type(tokenizer).__name__,
        "config": {k: getattr(config, k) for k in ("num_key_value_heads", "rope_theta", "tie_word_embeddings")},
        "missing_keys": missing, "unexpected_keys": unexpected,
        "eos_token": tokenizer.eos_token, "ids": tokenizer(str(inputs["text"]))["input_ids"],
    }))


def make_random(hf_dir, tokenizer_file, inputs_file, overrides="{}"):
    """A random Llama (grouped-query attention, untied head) made by transformers with our tokenizer,
    saved in the PyTorch layout the Hub, TGI and vLLM use; transformers' own PyTorch-to-Flax loader
    must read it back to the same parameters. Prints its loss on the batch in inputs_file."""
    import os
    import shutil

    import jax
    import jax.numpy as jnp
    from flax.traverse_util import flatten_dict
    from safetensors.numpy import save_file
    from transformers import LlamaConfig

    values = dict(vocab_size=300, hidden_size=32, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  bos_token_id=0, eos_token_id=0)
    values.update(json.loads(overrides))
    config = LlamaConfig(**values)
    model = _flax_llama(config.rope_theta)(config, seed=7)
    flat = flatten_dict(model.params)
    noise = jax.random.split(jax.random.PRNGKey(3), len(flat))
    randomized = {key: value + 0.2 * jax.random.normal(k, value.shape) for (key, value), k in zip(flat.items(), noise)}
    pytorch = {}
    for key, value in randomized.items():  # Flax kernels are [in, out], PyTorch Linear weights [out, in]
        name = ".".join(key[:-1]) + ".weight"
        pytorch[name] = np.ascontiguousarray(np.asarray(value.T if key[-1] == "kernel" else value, np.float32))
    os.makedirs(hf_dir, exist_ok=True)
    config.save_pretrained(hf_dir)
    save_file(pytorch, os.path.join(hf_dir, "model.safetensors"), metadata={"format": "pt"})
    shutil.copyfile(tokenizer_file, os.path.join(hf_dir, "tokenizer.json"))
    loaded = _flax_llama(config.rope_theta).from_pretrained(hf_dir)
    reloaded = flatten_dict(loaded.params)
    assert sorted(reloaded) == sorted(randomized), sorted(set(reloaded) ^ set(randomized))
    assert all(np.array_equal(reloaded[key], randomized[key]) for key in randomized)
    batch = np.load(inputs_file)["batch"]
    logits = loaded(batch[:, :-1]).logits
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    loss = -jnp.take_along_axis(log_probs, batch[:, 1:, None], axis=-1).mean()
    np.savez(inputs_file + ".hf.npz", logits=np.asarray(logits))
    print(json.dumps({"loss": float(loss), "parameters": int(sum(v.size for v in reloaded.values()))}))


if __name__ == "__main__":
    {"export": export_check, "make_random": make_random}[sys.argv[1]](*sys.argv[2:])
