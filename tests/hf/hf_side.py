"""Run by tests/hf with .venv-hf's interpreter (transformers 4.46, TensorFlow): loads what
`lm.export --format hf` wrote with transformers' own classes and prints JSON results."""
import json
import sys

import numpy as np


def export_check(hf_dir, inputs_file):
    from transformers import AutoTokenizer, TFGPT2LMHeadModel

    inputs = np.load(inputs_file)
    model, info = TFGPT2LMHeadModel.from_pretrained(hf_dir, output_loading_info=True)
    logits = model(inputs["batch"]).logits.numpy()
    model.generation_config.eos_token_id = None  # 32 tokens on both sides, as lm.generate without stops
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


if __name__ == "__main__":
    {"export": export_check}[sys.argv[1]](*sys.argv[2:])
