"""Everything tests/eval evaluates, built here: a tiny GPT with random weights exported both as an
lmstack directory and (lm.hf) as a Hugging Face directory, a small prepared corpus of four sources
(its validation documents), and local lm-eval tasks of each request type (`dataset_path: json`)."""
import json
import os

import numpy as np
import pytest

from controlplane.presets import get_preset
from lm import hf, models
from lm.compat import keras
from lm.data import prepare
from lm.eval.scorer import Scorer
from lm.serving import export as lm_export
from lm.spec import shards
from lm.tokenizer import save, train_bpe
from lmstack import sample_corpus

SOURCES = ("Pile-CC", "Github", "ArXiv", "Wikipedia (en)")
BLOCK_SIZE = 512
GENERATION_STOPS = [" the", "\n\n"]
MAX_GEN_TOKS = 12


def _texts():
    """Short texts (at most 300 bytes) cut from the sample corpus."""
    texts = []
    for document in sample_corpus.sample_documents(200000, seed=2):
        text = document["text"]
        texts.extend(text[start:start + 300] for start in range(0, min(len(text), 3000), 300))
    return [text for text in texts if text.strip() and len(text.encode("utf-8")) <= 300]


def _task_yaml(directory, name, output_type, rows, fields):
    data = os.path.join(directory, name + ".jsonl")
    with open(data, "w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    lines = ["task: %s" % name, "dataset_path: json", "dataset_kwargs:", "  data_files:",
             "    test: %s" % json.dumps(data), "test_split: test", "output_type: %s" % output_type] + fields
    path = os.path.join(directory, name + ".yaml")
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


def _write_tasks(directory, scorer, texts):
    """Four tasks; the loglikelihood and generation targets are the model's own greedy continuation
    for half of the rows, so greedy decisions and exact matches are exercised, not only misses."""
    os.makedirs(directory)
    prompts = [text[:40] for text in texts[:8]]
    greedy = scorer.generate(prompts, MAX_GEN_TOKS, GENERATION_STOPS)
    _task_yaml(directory, "tiny_choice", "multiple_choice", [
        {"question": text[:60], "choices": [text[60:80], texts[i + 1][60:80], " the", " def"], "answer": i % 4}
        for i, text in enumerate(texts[10:18])],
        ['doc_to_text: "{{question}}"', 'doc_to_choice: "{{choices}}"', 'doc_to_target: "{{answer}}"',
         "metric_list:", "  - metric: acc", "  - metric: acc_norm"])
    short = scorer.generate(prompts, 2, [])
    _task_yaml(directory, "tiny_loglikelihood", "loglikelihood", [
        {"context": prompt, "target": short[i] if i % 2 == 0 else " and the rest"} for i, prompt in enumerate(prompts)],
        ['doc_to_text: "{{context}}"', 'doc_to_target: "{{target}}"', "metric_list:", "  - metric: perplexity",
         "  - metric: acc"])
    _task_yaml(directory, "tiny_perplexity", "loglikelihood_rolling", [
        {"text": " ".join(texts[20 + 6 * i:26 + 6 * i])} for i in range(3)],
        ['doc_to_text: ""', 'doc_to_target: "{{text}}"', "metric_list:", "  - metric: word_perplexity",
         "  - metric: byte_perplexity", "  - metric: bits_per_byte"])
    _task_yaml(directory, "tiny_generation", "generate_until", [
        {"question": prompt, "answer": greedy[i] if i % 2 == 0 else "no"} for i, prompt in enumerate(prompts)],
        ['doc_to_text: "{{question}}"', 'doc_to_target: "{{answer}}"', "generation_kwargs:",
         "  until: %s" % json.dumps(GENERATION_STOPS), "  max_gen_toks: %d" % MAX_GEN_TOKS, "  do_sample: false",
         "metric_list:", "  - metric: exact_match"])
    return ["tiny_choice", "tiny_loglikelihood", "tiny_perplexity", "tiny_generation"]


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """{"export", "hf", "dataset", "documents", "tasks", "include_path"}: paths of what the tests evaluate."""
    root = tmp_path_factory.mktemp("eval")
    os.environ.setdefault("HF_DATASETS_CACHE", str(root / "datasets-cache"))
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    texts = _texts()
    tokenizer_file = str(root / "tokenizer.json")
    save(train_bpe(texts, vocab_size=500), tokenizer_file)
    keras.utils.set_random_seed(5)
    config = get_preset("tiny").replace(vocab_size=500, block_size=BLOCK_SIZE)
    model = models.build(config)
    rng = np.random.default_rng(0)
    for weight in model.weights:  # LayerNorm and biases too, so a wrong mapping would show
        base = 1.0 if "gamma" in weight.name else 0.0
        weight.assign(base + rng.normal(0, 0.2, weight.shape).astype(np.float32))
    export_dir = lm_export.export_model(model, config, tokenizer_file, str(root / "export"))
    hf_dir = hf.export_hf(export_dir, str(root / "hf"))

    raw = str(root / "raw")
    os.makedirs(raw)
    documents = [{"text": text, "meta": {"pile_set_name": SOURCES[i % len(SOURCES)]}} for i, text in enumerate(texts)]
    sample_corpus.write_file(os.path.join(raw, "00.jsonl.zst"), documents[:len(documents) // 2])
    sample_corpus.write_file(os.path.join(raw, "01.jsonl.zst"), documents[len(documents) // 2:])
    dataset = str(root / "dataset")
    assert prepare.main([raw, "--output", dataset, "--tokenizer", tokenizer_file, "--seq-len", "64",
                         "--val-fraction", "0.3", "--workers", "1", "--threads", "1"]) == 0

    scorer = Scorer.from_dir(export_dir)
    include_path = str(root / "tasks")
    tasks = _write_tasks(include_path, scorer, texts)
    return {"export": export_dir, "hf": hf_dir, "dataset": dataset, "documents": shards.val_documents_files(dataset),
            "tasks": tasks, "include_path": include_path}
