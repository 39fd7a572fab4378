"""lm-eval with `--model lmstack` against lm-eval's own `hf` model (transformers, torch) on the same
tiny model, request by request, on a task of each request type; and per-source bits per byte of a
prepared corpus against each document's log-likelihood computed by transformers' GPT2LMHeadModel.
The hf side runs in .venv-hf (tests/eval/hf_eval_side.py): no fake, the other side is the real library."""
import json
import math
import os
import subprocess

import pytest

from hf_eval_side import responses
from lm.eval import headline
from lm.eval.model import model_class
from lm.eval.pile_bpb import pile_bpb

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HF_PYTHON = os.path.join(ROOT, ".venv-hf", "bin", "python")
HF_SIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_eval_side.py")
# Per request: 1e-4, or float32's own resolution where a log-likelihood is large (the hf model sums a
# rolling window's token log-probabilities in float32: at -5800 one float32 step is 0.0005).
ABSOLUTE, RELATIVE = 1e-4, 2 ** -23


def close(mine, reference):
    return math.isclose(mine, reference, rel_tol=RELATIVE, abs_tol=ABSOLUTE)

requires_hf_venv = pytest.mark.skipif(
    not os.access(HF_PYTHON, os.X_OK) and not os.environ.get("CI"),
    reason=".venv-hf is missing: build it with `make .venv-hf/.installed` (`make test` does)")


@pytest.fixture(scope="module")
def lmstack_side(built):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    lm = model_class()(pretrained=built["export"], batch_size=4)
    evaluated = simple_evaluate(model=lm, tasks=built["tasks"], log_samples=True, bootstrap_iters=0,
                                task_manager=TaskManager(include_path=built["include_path"]))
    return {"results": evaluated["results"], "responses": responses(evaluated["samples"]), "lm": lm}


@pytest.fixture(scope="module")
def hf_side(built, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("hf-side") / "hf.json")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1")
    result = subprocess.run([HF_PYTHON, HF_SIDE, built["hf"], ",".join(built["tasks"]), built["include_path"],
                             ",".join(built["documents"]), output], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    with open(output) as handle:
        return json.load(handle)


@requires_hf_venv
def test_every_request_matches_lm_evals_hf_model(built, lmstack_side, hf_side):
    ours, theirs = lmstack_side["responses"], hf_side["responses"]
    assert sorted(ours) == sorted(theirs) == sorted(built["tasks"])
    kinds = set()
    for task in built["tasks"]:
        assert sorted(ours[task]) == sorted(theirs[task]) and ours[task]
        for doc_id, requests in ours[task].items():
            assert len(requests) == len(theirs[task][doc_id])
            for mine, reference in zip(requests, theirs[task][doc_id]):
                where = "%s doc %s: lmstack %r, hf %r" % (task, doc_id, mine, reference)
                if isinstance(mine, str):  # generate_until: the same greedy text, cut at the same stop
                    kinds.add("generation")
                    assert mine == reference, where
                elif isinstance(mine, (list, tuple)):  # loglikelihood: (log-probability, is greedy)
                    kinds.add("loglikelihood")
                    assert close(mine[0], reference[0]) and bool(mine[1]) == bool(reference[1]), where
                else:  # loglikelihood_rolling: the document's log-likelihood
                    kinds.add("rolling")
                    assert close(mine, reference), where
    assert kinds == {"generation", "loglikelihood", "rolling"}


@requires_hf_venv
def test_the_metrics_match_and_the_greedy_cases_are_hit(lmstack_side, hf_side):
    ours, theirs = lmstack_side["results"], hf_side["results"]
    for task, metric in [("tiny_choice", "acc,none"), ("tiny_choice", "acc_norm,none"),
                         ("tiny_loglikelihood", "acc,none"), ("tiny_generation", "exact_match,none")]:
        assert ours[task][metric] == theirs[task][metric], (task, metric)
    for task, metric in [("tiny_loglikelihood", "perplexity,none"), ("tiny_perplexity", "word_perplexity,none"),
                         ("tiny_perplexity", "byte_perplexity,none"), ("tiny_perplexity", "bits_per_byte,none")]:
        assert math.isclose(ours[task][metric], theirs[task][metric], rel_tol=1e-5), (task, metric)
    # Half the targets are the model's own greedy continuation (some re-tokenize otherwise): hits agree too.
    assert ours["tiny_loglikelihood"]["acc,none"] > 0 and ours["tiny_generation"]["exact_match,none"] > 0
    flat = headline({"tasks": ours, "pile_bpb": None})
    assert flat["tiny_choice/acc"] == ours["tiny_choice"]["acc,none"]
    assert "tiny_perplexity/bits_per_byte" in flat and not [name for name in flat if "stderr" in name]


@requires_hf_venv
def test_bits_per_byte_per_source_equals_transformers_per_document(built, lmstack_side, hf_side):
    figures = pile_bpb(lmstack_side["lm"].scorer, built["dataset"])
    reference = hf_side["documents"]
    assert sorted(figures["sources"]) == sorted(reference) and len(reference) == 4
    for source, (logprob, tokens, text_bytes, documents) in reference.items():
        mine = figures["sources"][source]
        assert (mine["tokens"], mine["bytes"], mine["documents"]) == (tokens, text_bytes, documents), source
        assert math.isclose(mine["bits_per_byte"], -logprob / math.log(2) / text_bytes, rel_tol=1e-5), source
    total_logprob = sum(entry[0] for entry in reference.values())
    total_bytes = sum(entry[2] for entry in reference.values())
    assert figures["total"]["bytes"] == total_bytes
    assert math.isclose(figures["total"]["bits_per_byte"], -total_logprob / math.log(2) / total_bytes, rel_tol=1e-5)
