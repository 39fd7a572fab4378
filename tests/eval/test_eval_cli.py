"""python -m lm.eval end to end, its refusals, and the scorer's generation (KV cache, stop strings)."""
import json
import os
import sys

import pytest

from lm.eval import harness, headline, task_names_and_paths
from lm.eval.__main__ import main
from lm.eval.pile_bpb import DocumentsError, read_documents
from lm.eval.scorer import ModelDirError, Scorer, check_batch_size, cut_at_stops
from lm.serving.generate import generate_tokens


# The command lines run in this process: a subprocess would only add a TensorFlow and lm-eval start-up.
def test_the_cli_writes_tasks_bits_per_byte_and_headline(built, tmp_path, capsys):
    output = str(tmp_path / "results" / "eval.json")
    assert main(["--model-dir", built["hf"], "--tasks", "tiny_choice," + os.path.join(
        built["include_path"], "tiny_generation.yaml"), "--include-path", built["include_path"], "--limit", "3",
        "--documents", built["documents"][0], "--batch-size", "2", "--output", output]) == 0
    with open(output) as handle:
        results = json.load(handle)
    assert sorted(results["tasks"]) == ["tiny_choice", "tiny_generation"]
    assert results["tasks"]["tiny_choice"]["sample_len"] == 3
    figures = results["pile_bpb"]
    assert figures["total"]["documents"] == sum(source["documents"] for source in figures["sources"].values())
    assert results["headline"] == headline(results)
    assert results["headline"]["pile_bpb/total"] == figures["total"]["bits_per_byte"] > 0
    assert "tiny_choice/acc" in results["headline"] and "tiny_generation/exact_match" in results["headline"]
    assert "pile_bpb/total" in capsys.readouterr().out and not os.path.exists(output + ".partial")


def test_lm_evals_own_command_line_runs_the_lmstack_model(built, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["python -m lm.eval.harness", "--model", "lmstack", "--model_args",
                                      "pretrained=%s" % built["export"], "--batch_size", "2", "--tasks",
                                      "tiny_loglikelihood", "--include_path", built["include_path"], "--limit", "2",
                                      "--output_path", str(tmp_path / "out")])
    harness.main()
    (written,) = [os.path.join(root, name) for root, _, names in os.walk(str(tmp_path / "out")) for name in names
                  if name.startswith("results")]
    with open(written) as handle:
        assert json.load(handle)["results"]["tiny_loglikelihood"]["sample_len"] == 2


@pytest.mark.parametrize("args, message", [
    (["--output", "x.json"], "--model-dir"),
    (["--model-dir", "d", "--output", "x.json"], "nothing to evaluate"),
    (["--model-dir", "d", "--documents", "f", "--limit", "0", "--output", "x.json"], "--limit must be"),
])
def test_the_cli_refuses_bad_arguments_naming_them(args, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_bad_inputs_name_the_field(tmp_path):
    with pytest.raises(ModelDirError, match="pretrained=.*model.json.*config.json"):
        Scorer.from_dir(str(tmp_path))
    for bad in (0, -1, "x", True, 1.5):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1 or 'auto'"):
            check_batch_size(bad)
    assert check_batch_size("8") == 8 and check_batch_size("auto") == check_batch_size(None)
    with pytest.raises(ValueError, match="no such task YAML"):
        task_names_and_paths([str(tmp_path / "missing.yaml")])
    (tmp_path / "nameless.yaml").write_text("dataset_path: json\n")
    with pytest.raises(ValueError, match="'task' name"):
        task_names_and_paths([str(tmp_path / "nameless.yaml")])
    bad = tmp_path / "docs.jsonl"
    bad.write_text('{"text": "a", "meta": {"pile_set_name": "X"}}\n{"meta": {}}\n')
    with pytest.raises(DocumentsError, match="docs.jsonl:2: needs a string field 'text'"):
        read_documents(str(bad))


def test_a_task_yaml_is_found_through_its_directory(tmp_path):
    (tmp_path / "mine.yaml").write_text("task: my_task\ndoc_to_text: !function utils.text\n")
    assert task_names_and_paths(["arc_easy", str(tmp_path / "mine.yaml")], "extra") == (
        ["arc_easy", "my_task"], ["extra", str(tmp_path)])


def test_headline_keeps_metrics_and_filters_without_stderr():
    results = {"tasks": {"t": {"alias": "t", "sample_len": 5, "acc,none": 0.5, "acc_stderr,none": 0.1,
                               "exact_match,strict-match": 0.25, "x,none": "N/A"}},
               "pile_bpb": {"total": {"bits_per_byte": 1.5}, "sources": {"Github": {"bits_per_byte": 1.25}}}}
    assert headline(results) == {"t/acc": 0.5, "t/exact_match,strict-match": 0.25, "pile_bpb/total": 1.5,
                                 "pile_bpb/Github": 1.25}


def test_generation_uses_the_kv_cache_and_cuts_at_the_first_stop(built):
    scorer = Scorer.from_dir(built["export"], batch_size=2)
    init_cache, calls = scorer.model.init_cache, []
    scorer.model.init_cache = lambda *args: calls.append(args) or init_cache(*args)
    prompts = ["def main(", "The quick", "import os"]
    free = scorer.generate(prompts, 10, [])
    assert calls, "generation did not use the key/value cache"
    ids = [scorer.encode(prompt) for prompt in prompts]
    recomputed = generate_tokens(scorer.model, scorer.config, ids, 10, temperature=0.0, stop_tokens=[0],
                                 use_cache=False)
    assert free == [scorer.decode(row) for row in recomputed]
    stop = next(text[2:4] for text in free if len(text) >= 4)
    stopped = scorer.generate(prompts, 10, [stop])
    assert stopped == [cut_at_stops(text, [stop]) for text in free] and stopped != free
    with pytest.raises(ValueError, match="max_gen_toks"):
        scorer.generate(prompts, scorer.max_length, [])


def test_a_context_of_whitespace_alone_is_scored_after_the_prefix_token_as_an_empty_one(built):
    from lm_eval.api.instance import Instance

    from lm.eval import model as eval_model

    lm = eval_model.model_class()(pretrained=built["export"], batch_size=2)
    requests = [Instance("loglikelihood", {}, (context, continuation), 0)
                for context, continuation in ((" ", "def main"), ("", " def main"))]
    whitespace, empty = lm.loglikelihood(requests)
    # lm-eval moves the space into the continuation, so both score " def main" after the end-of-document token
    expected = lm.scorer.loglikelihoods([([lm.prefix_token_id], lm.scorer.encode(" def main"))])[0]
    assert whitespace == pytest.approx(expected) and empty == pytest.approx(expected)
