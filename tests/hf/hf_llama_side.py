"""Run by tests/hf/test_hf_llama.py with .venv-hf's interpreter: transformers 4.46's own PyTorch
LlamaForCausalLM (torch on CPU, float32) loads what `python -m lm.hf --format hf` wrote, or writes the
checkpoints a release looks like; prints JSON, and leaves logits and greedy tokens in `<inputs>.hf.npz`.

PyTorch's class is the reference: it reads rope_theta, rope_scaling and tie_word_embeddings from
config.json, as TGI and vLLM do (the Flax class of 4.46 ignores all three).
"""
import json
import os
import sys

import numpy as np

GENERATED_TOKENS = 16


def _torch():
    import torch

    torch.manual_seed(0)
    return torch


def _greedy(model, prompts):
    """GENERATED_TOKENS greedy tokens after each prompt, without stopping at an end token (as
    lm.serving.generate runs without stop tokens)."""
    torch = _torch()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor(prompts, dtype=torch.long), max_new_tokens=GENERATED_TOKENS, do_sample=False,
                             pad_token_id=0, attention_mask=torch.ones(prompts.shape, dtype=torch.long))
    return out[:, prompts.shape[1]:].numpy()


def _logits(model, batch):
    torch = _torch()
    with torch.no_grad():
        return model(torch.tensor(batch, dtype=torch.long)).logits.float().numpy()


def _load(hf_dir):
    """The checkpoint as transformers loads it, computing in float32 (bfloat16 weights widened)."""
    from transformers import LlamaForCausalLM

    model, info = LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=_torch().float32, output_loading_info=True)
    return model.eval(), info


def _stored_dtypes(hf_dir):
    from safetensors import safe_open

    dtypes = set()
    for name in sorted(os.listdir(hf_dir)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(hf_dir, name), "pt") as f:
                dtypes.update(str(f.get_slice(key).get_dtype()) for key in f.keys())
    return sorted(dtypes)


def export_check(hf_dir, inputs_file):
    """Load our export; its logits on inputs' `batch`, greedy tokens after its `prompts`, the
    tokenizer, and PyTorch's bfloat16 rounding of inputs' `round` (to compare lm.hf.files')."""
    torch = _torch()
    from transformers import AutoTokenizer

    inputs = np.load(inputs_file)
    model, info = _load(hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    rounded = torch.from_numpy(inputs["round"]).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.savez(inputs_file + ".hf.npz", logits=_logits(model, inputs["batch"]),
             generated=_greedy(model, inputs["prompts"]), rounded=rounded)
    config = model.config
    print(json.dumps({
        "class": type(model).__name__, "tokenizer_class": type(tokenizer).__name__,
        "config": {"num_key_value_heads": config.num_key_value_heads, "rope_theta": config.rope_theta,
                   "tie_word_embeddings": config.tie_word_embeddings, "rope_scaling": config.rope_scaling},
        "tied": model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(),
        "missing_keys": sorted(info["missing_keys"]), "unexpected_keys": sorted(info["unexpected_keys"]),
        "mismatched_keys": [list(map(str, key)) for key in info["mismatched_keys"]],
        "stored_dtypes": _stored_dtypes(hf_dir), "files": sorted(os.listdir(hf_dir)),
        "eos_token": tokenizer.eos_token, "ids": tokenizer(str(inputs["text"]))["input_ids"],
    }))


# The published-style checkpoints: how a release is saved (dtype, shards) and its config.json values
# beyond the common ones. "llama-3.2-like" is Llama 3.2 1B's shape in miniature: four query heads per
# key/value head, the head tied to the embedding, rope_theta 500000, "llama3" rope scaling, bfloat16.
# rope scaling acts on wavelengths beyond original_max_position_embeddings / high_freq_factor: with 16
# of the 64 positions "unscaled", the inputs' 64-token sequences reach well past it.
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}
PUBLISHED = {
    "bf16": ({}, "bfloat16", None),
    "sharded": ({}, "bfloat16", "20KB"),
    "rope-scaling-llama3": ({"rope_scaling": LLAMA3_SCALING}, "float32", None),
    "llama-3.2-like": ({"num_attention_heads": 8, "num_key_value_heads": 2, "tie_word_embeddings": True,
                        "rope_theta": 500000.0, "rope_scaling": LLAMA3_SCALING, "hidden_size": 64,
                        "intermediate_size": 128}, "bfloat16", "30KB"),
}


def make_published(root, tokenizer_file, inputs_file):
    """Write each PUBLISHED checkpoint under root/<name> with transformers (random weights, our
    tokenizer), load it back as transformers does, and keep its float32 logits, loss and greedy tokens."""
    import shutil

    torch = _torch()
    from transformers import LlamaConfig, LlamaForCausalLM

    inputs = np.load(inputs_file)
    batch, prompts = inputs["batch"], inputs["prompts"]
    report, arrays = {}, {}
    for name, (overrides, dtype, max_shard_size) in PUBLISHED.items():
        values = dict(vocab_size=300, hidden_size=32, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      bos_token_id=0, eos_token_id=0)
        values.update(overrides)
        model = LlamaForCausalLM(LlamaConfig(**values))
        with torch.no_grad():  # weights large enough that every one shows in the logits
            for parameter_name, parameter in model.named_parameters():
                noise = 0.3 * torch.randn(parameter.shape)
                parameter.copy_(1.0 + noise if parameter_name.endswith("norm.weight") else noise)
        hf_dir = os.path.join(root, name)
        model.to(getattr(torch, dtype)).save_pretrained(hf_dir, **(
            {"max_shard_size": max_shard_size} if max_shard_size else {}))
        shutil.copyfile(tokenizer_file, os.path.join(hf_dir, "tokenizer.json"))
        loaded, info = _load(hf_dir)
        assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"]), info
        logits = _logits(loaded, batch[:, :-1])
        log_probs = torch.log_softmax(torch.from_numpy(logits), dim=-1)
        loss = -log_probs.gather(-1, torch.from_numpy(batch[:, 1:]).long()[..., None]).mean()
        arrays[name + "/logits"], arrays[name + "/generated"] = logits, _greedy(loaded, prompts)
        report[name] = {"loss": float(loss), "parameters": int(sum(p.numel() for p in loaded.parameters())),
                        "files": sorted(os.listdir(hf_dir)), "stored_dtypes": _stored_dtypes(hf_dir)}
        if "rope_scaling" in overrides:  # the same weights, rotary embeddings unscaled: the scaling must matter
            unscaled = LlamaForCausalLM(LlamaConfig(**dict(values, rope_scaling=None))).eval()
            unscaled.load_state_dict(loaded.state_dict())
            report[name]["unscaled_max_logit_change"] = float(np.abs(_logits(unscaled, batch[:, :-1]) - logits).max())
    np.savez(inputs_file + ".hf.npz", **arrays)
    print(json.dumps(report))


def config_check(*hf_dirs):
    """Load each directory's config.json as transformers does (AutoConfig), recording what its logging
    and Python's warnings report meanwhile; prints {directory: {warnings, max_position_embeddings,
    rope_scaling}}."""
    import logging
    import warnings

    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    class Recorder(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    hf_logging.set_verbosity_warning()
    hf_logging.get_logger().addHandler(Recorder(logging.WARNING))
    report = {}
    for hf_dir in hf_dirs:
        messages = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            config = AutoConfig.from_pretrained(hf_dir)
        report[hf_dir] = {"warnings": messages + [str(warning.message) for warning in caught],
                          "max_position_embeddings": config.max_position_embeddings,
                          "rope_scaling": config.rope_scaling}
    print(json.dumps(report))


if __name__ == "__main__":
    {"export": export_check, "make_published": make_published, "config": config_check}[sys.argv[1]](*sys.argv[2:])
