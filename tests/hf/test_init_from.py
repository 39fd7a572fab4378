"""lm.training.train from a Hugging Face GPT-2 (init_from, issue 17.3) and with the Hugging Face export
as a training-job option (export_hf, issue 17.1).

The other side is the real library: a random GPT-2 built and saved by transformers' own
TFGPT2LMHeadModel in .venv-hf (tests/hf/hf_side.py), no download. Its tokenizer (the
tokenizer.json in the directory) is what lm.data.prepare tokenizes the dataset with; the first
training step's loss must be the loss transformers computes on that very batch.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from test_hf_export import ROOT, requires_hf_venv, run_hf_side

from controlplane import presets
from lm.data import dataset
from lm.data import prepare
from lmstack import sample_corpus
from lm.spec import shards
from lm.training import train
from lm import hf
from lm.serving import export as lm_export
from lm.tokenizer import EOD_TOKEN, save, train_bpe
from family_cases import having_message

TRAINING_IMAGE = os.path.join(ROOT, "training_image")
# The tiny preset's shape (2 layers, width 64, 4 heads); vocabulary and context are the checkpoint's.
TINY_SHAPE = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128}
SEQ_LEN = 32
BATCH = 8


def train_arguments(data_dir, tmp, *extra, **hyperparameters):
    values = presets.resolve({"preset": "tiny", "global_batch_size": BATCH, "max_steps": 1, "log_every": 1, "eval_every": 0,
                   "eval_batches": 1, "checkpoint_every": 0, "checkpoint_minutes": 0, "seed": 7, "xla": False,
                              **hyperparameters})
    args = ["--data-dir", data_dir, "--checkpoint-dir", os.path.join(tmp, "ckpt"),
            "--export-dir", os.path.join(tmp, "model")]
    for name, value in values.items():
        args += ["--" + name, json.dumps(value)]
    return args + list(extra)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("init")
    raw = str(root / "raw")
    sample_corpus.write_sample_corpus(raw, max_bytes=60000, files=1)
    texts = [doc["text"] for doc in sample_corpus.sample_documents(60000, seed=0)]
    tokenizer_file = str(root / "tokenizer.json")
    save(train_bpe(texts, vocab_size=300), tokenizer_file)
    return root, raw, tokenizer_file


def prepared(raw, tokenizer_file, output):
    assert prepare.main([raw, "--output", output, "--tokenizer", tokenizer_file, "--seq-len", str(SEQ_LEN),
                         "--shard-size", "64KiB", "--threads", "1", "--workers", "1", "--val-fraction", "0"]) == 0
    return output


@pytest.fixture(scope="module")
def transformers_gpt2(corpus):
    """(hf_dir, dataset tokenized with its tokenizer, transformers' loss on the first training batch)."""
    root, raw, tokenizer_file = corpus
    hf_dir = str(root / "gpt2")
    os.makedirs(hf_dir)
    data_dir = prepared(raw, tokenizer_file, str(root / "dataset"))
    manifest = shards.load_manifest(data_dir)
    # The batch lm.training.train's first step takes (same stream, same seed), as one record per row.
    stream = dataset.TokenStream(data_dir, "train", global_batch_size=BATCH, dp_rank=0, dp_size=1, seed=7,
                              seq_len=manifest.seq_len, vocab_size=300)
    batches = stream.batches(0)
    inputs, labels = next(batches)
    batches.close()
    records = np.concatenate([np.asarray(inputs), np.asarray(labels)[:, -1:]], axis=1).astype(np.int32)
    inputs_file = str(root / "batch.npz")
    np.savez(inputs_file, batch=records)
    from tokenizers import Tokenizer
    eod = Tokenizer.from_file(tokenizer_file).token_to_id(EOD_TOKEN)
    overrides = dict(TINY_SHAPE, vocab_size=300, bos_token_id=eod, eos_token_id=eod)
    theirs = run_hf_side("make_random", hf_dir, tokenizer_file, inputs_file, json.dumps(overrides))["loss"]
    return hf_dir, data_dir, theirs


@requires_hf_venv
def test_the_first_step_loss_is_transformers_loss_on_the_same_batch(transformers_gpt2, tmp_path):
    hf_dir, data_dir, theirs = transformers_gpt2
    hp, paths = train.parse_args(train_arguments(data_dir, str(tmp_path), "--init-from", hf_dir))
    training = train.Training(hp, paths)
    assert (training.config.vocab_size, training.config.padded_vocab_size, training.config.block_size) == (300, 300, 128)
    batches = training.train_stream.batches(0)
    inputs, labels = next(batches)
    batches.close()
    ours = float(training.train_one(inputs, labels)["loss"])
    assert abs(ours - theirs) <= 1e-5 * max(1.0, abs(theirs)), (ours, theirs)


@requires_hf_venv
def test_init_from_comes_from_the_init_channel_and_the_run_exports(transformers_gpt2, tmp_path, monkeypatch, capsys):
    """Under SageMaker the directory is the `init` channel (SM_CHANNEL_INIT); the run trains and
    exports as usual, its tokenizer is the checkpoint's."""
    hf_dir, data_dir, _ = transformers_gpt2
    for name in [name for name in os.environ if name.startswith("SM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SM_CHANNEL_INIT", hf_dir)
    assert train.main(train_arguments(data_dir, str(tmp_path), max_steps=2)) == 0
    assert "initialized the weights from the Hugging Face checkpoint in %s" % hf_dir in capsys.readouterr().out
    _, config, tokenizer = lm_export.load_exported(str(tmp_path / "model"))
    assert config.vocab_size == 300
    with open(os.path.join(hf_dir, "tokenizer.json")) as f:
        assert json.loads(tokenizer.to_str())["model"]["vocab"] == json.load(f)["model"]["vocab"]


def _our_gpt2(tmp_path, preset="tiny"):
    """An HF directory written by lm.hf (no transformers): enough for the refusals below."""
    from lm import models
    from controlplane.presets import get_preset

    config = get_preset(preset).replace(vocab_size=300, pad_vocab_to=1)
    tokenizer_file = str(tmp_path / "tok.json")
    save(train_bpe(["a small text %d" % i for i in range(40)], vocab_size=300), tokenizer_file)
    export_dir = lm_export.export_model(models.build(config), config, tokenizer_file, str(tmp_path / "ours"))
    return hf.export_hf(export_dir, str(tmp_path / "gpt2"))


def test_a_dataset_tokenized_otherwise_is_refused(corpus, tmp_path):
    root, raw, tokenizer_file = corpus
    data_dir = prepared(raw, tokenizer_file, str(tmp_path / "dataset"))
    hf_dir = _our_gpt2(tmp_path)  # another tokenizer
    hp, paths = train.parse_args(train_arguments(data_dir, str(tmp_path), "--init-from", hf_dir))
    with pytest.raises(hf.HFError, match="whose vocabulary differs from the checkpoint's .*prepare the dataset with "
                                         "tokenizer=.*tokenizer.json"):
        train.Training(hp, paths)
    # The same run with the checkpoint's own tokenizer passes that check.
    same = prepared(raw, os.path.join(hf_dir, "tokenizer.json"), str(tmp_path / "same"))
    hp, paths = train.parse_args(train_arguments(same, str(tmp_path), "--init-from", hf_dir))
    assert train.Training(hp, paths).config.vocab_size == 300


def test_a_checkpoint_of_another_shape_than_the_preset_is_refused(corpus, tmp_path):
    hf_dir = _our_gpt2(tmp_path)
    with open(os.path.join(hf_dir, "config.json")) as f:
        values = json.load(f)
    from controlplane.presets import get_preset
    with pytest.raises(hf.HFError, match=r"the checkpoint is not preset gpt-125m: n_layer 2 \(checkpoint\) vs 12; "
                                         r"d_model 64 \(checkpoint\) vs 768; n_head 4 \(checkpoint\) vs 12"):
        hf.init_config(hf_dir, get_preset("gpt-125m"), "preset gpt-125m")
    assert hf.init_config(hf_dir, get_preset("tiny"), "preset tiny").block_size == values["n_positions"]


def test_a_checkpoint_of_another_family_is_refused_naming_both(tmp_path, monkeypatch):
    """init_from reads the checkpoint's config.json model_type and the model_type the trained family
    declares (lm.spec.families: gpt -> gpt2): a GPT-2 checkpoint under a family of another layout is
    refused, not trained as a GPT. Shown with gpt declaring another layout, and with a checkpoint of one."""
    from lm.spec import families
    from controlplane.presets import get_preset

    hf_dir = _our_gpt2(tmp_path)
    monkeypatch.setitem(families.FAMILIES, "gpt", families.FAMILIES["gpt"]._replace(hf_model_type="llama"))
    with pytest.raises(hf.HFError, match=r"config.json: model_type 'gpt2' is not the Hugging Face layout of model gpt "
                                         r"\(model_type 'llama'\)"):
        hf.init_config(hf_dir, get_preset("tiny"), "preset tiny")
    monkeypatch.undo()
    with open(os.path.join(hf_dir, "config.json")) as f:
        values = json.load(f)
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(dict(values, model_type="llama"), f)
    with pytest.raises(hf.HFError, match=r"model_type 'llama' is not the Hugging Face layout of model gpt "
                                         r"\(model_type 'gpt2'\)"):
        hf.init_config(hf_dir, get_preset("tiny"), "preset tiny")
    with pytest.raises(hf.HFError, match=r"config.json: model_type llama needs the fields hidden_size, "
                                         r"num_attention_heads, num_hidden_layers, intermediate_size"):
        hf.import_hf(hf_dir, str(tmp_path / "imported"))  # a GPT-2 config.json is not read as a Llama one


def test_init_from_with_a_family_without_hf_import_is_refused_before_any_work(tmp_path):
    with pytest.raises(train.UsageError, match=r"^model rnn cannot use init_from \(a Hugging Face checkpoint\) "
                                               r"\(capability hf_import: .*\); " + having_message("hf_import") + "$"):
        train.parse_args(train_arguments(str(tmp_path), str(tmp_path), "--init-from", str(tmp_path), model="rnn",
                                         preset="rnn-tiny"))


BLOCK_TRANSFORMERS = "raise ImportError('transformers is not in the training image')\n"


@requires_hf_venv
def test_export_hf_in_the_training_job_loads_in_transformers_without_it_in_the_image(corpus, tmp_path):
    """lm.training.train with export_hf runs where importing transformers or safetensors fails (as in the
    training image); transformers then loads /opt/ml/model itself, with our logits."""
    root, raw, tokenizer_file = corpus
    data_dir = prepared(raw, tokenizer_file, str(tmp_path / "dataset"))
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    for name in ("transformers", "safetensors", "torch"):
        (blocked / ("%s.py" % name)).write_text(BLOCK_TRANSFORMERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM_")}
    env.update(PYTHONPATH=os.pathsep.join([str(blocked), TRAINING_IMAGE]), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, "-m", "lm.training.train"] + train_arguments(
        data_dir, str(tmp_path), max_steps=3, export_hf=True), capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    model_dir = str(tmp_path / "model")
    assert sorted(os.listdir(model_dir)) == sorted([
        "model.json", "weights.npz", "tokenizer.json",  # ours, for lm.serving.server
        "config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json"])  # transformers'
    model, config, _ = lm_export.load_exported(model_dir)
    batch = np.random.default_rng(5).integers(0, config.vocab_size, [2, 12]).astype(np.int32)
    prompts = batch[:, :4]
    inputs = str(tmp_path / "inputs.npz")
    np.savez(inputs, batch=batch, prompts=prompts, text="a small corpus")
    report = run_hf_side("export", model_dir, inputs)
    assert report["class"] == "TFGPT2LMHeadModel" and report["missing_keys"] == report["unexpected_keys"] == []
    theirs = np.load(inputs + ".hf.npz")["logits"]
    ours = model(batch).numpy()[:, :, :config.vocab_size]
    assert np.max(np.abs(theirs - ours)) <= 1e-4
