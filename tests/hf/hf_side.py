"""Run by tests/hf with .venv-hf's interpreter (transformers 4.46, TensorFlow): loads what
`lm.hf --format hf` wrote with transformers' own classes and prints JSON results."""
import json
import sys

import numpy as np


def export_check(hf_dir, inputs_file):
    from transformers import AutoTokenizer, TFGPT2LMHeadModel

    inputs = np.load(inputs_file)
    model, info = TFGPT2LMHeadModel.from_pretrained(hf_dir, output_loading_info=True)
    logits = model(inputs["batch"]).logits.numpy()
    model.generation_config.eos_token_id = None  # 32 tokens on both sides, as lm.serving.generate without stops
    generated = model.generate(inputs["prompts"], max_new_tokens=32, do_sample=False, use_cache=True,
                               pad_token_id=0).numpy()[:, inputs["prompts"].shape[1]:]
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    np.savez(inputs_file + ".hf.npz", logits=logits, generated=generated)
    print(json.dumps({
        "class": type(model).__name__, "tokenizer_class": type(tokenizer).__name__,
        "missing_keys": sorted(info["missing_keys"]), "unexpected_keys": sorted(info["unexpected_keys"]),
        "mismatched_keys": [str(k) for k in info["mismatched_keys"]],
        "eos_token": tokenizer.eos_token, "eos_token_id": tokenizer.eos_token_id,
        "ids": tokenizer(str(inputs["text"]))["input_ids"],
    }))


def make_random(hf_dir, tokenizer_file, inputs_file, overrides="{}"):
    """A random GPT-2 saved by transformers (TF, safetensors) with our tokenizer, and its loss
    on the batch in inputs_file (labels = inputs, shifted inside transformers). `overrides`:
    JSON of GPT2Config fields to change."""
    import shutil

    import tensorflow as tf
    from transformers import GPT2Config, TFGPT2LMHeadModel

    tf.keras.utils.set_random_seed(7)
    values = dict(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=300, resid_pdrop=0.0,
                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    values.update(json.loads(overrides))
    config = GPT2Config(**values)
    model = TFGPT2LMHeadModel(config)
    model(model.dummy_inputs)
    for weight in model.weights:  # LayerNorm and biases too, so a wrong mapping shows
        weight.assign(weight + tf.random.normal(weight.shape, stddev=0.2))
    model.save_pretrained(hf_dir, safe_serialization=True)
    shutil.copyfile(tokenizer_file, hf_dir + "/tokenizer.json")
    batch = np.load(inputs_file)["batch"]
    loss = model(batch, labels=batch, training=True).loss.numpy()
    print(json.dumps({"loss": float(np.mean(loss))}))


if __name__ == "__main__":
    {"export": export_check, "make_random": make_random}[sys.argv[1]](*sys.argv[2:])
