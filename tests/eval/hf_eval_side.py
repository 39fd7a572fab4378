"""Run by tests/eval with .venv-hf's interpreter (transformers, torch, lm-eval): lm-eval's own `hf`
model on a Hugging Face directory, and each document's log-likelihood straight from transformers'
GPT2LMHeadModel; writes both as JSON."""
import json
import sys


def responses(samples):
    """{task: {doc_id: [each request's response]}}: loglikelihood [logprob, is_greedy], rolling a
    number, generate_until the text."""
    return {task: {str(sample["doc_id"]): [response[0] for response in sample["resps"]] for sample in rows}
            for task, rows in samples.items()}


def harness(hf_dir, tasks, include_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    evaluated = simple_evaluate(model="hf", model_args="pretrained=%s,dtype=float32" % hf_dir, device="cpu",
                                batch_size=4, tasks=tasks.split(","), log_samples=True, bootstrap_iters=0,
                                task_manager=TaskManager(include_path=include_path))
    return {"results": evaluated["results"], "responses": responses(evaluated["samples"])}


def document_sums(hf_dir, documents_files):
    """{source: [sum of token log-probabilities, tokens, UTF-8 bytes, documents]}: each document in one
    forward pass after the end-of-text token (each must fit the model's context)."""
    import torch
    from transformers import AutoTokenizer, GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    sums = {}
    for path in documents_files:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                document = json.loads(line)
                ids = tokenizer(document["text"])["input_ids"]
                if len(ids) + 1 > model.config.n_positions:
                    raise SystemExit("a document of %d tokens does not fit the context" % len(ids))
                inputs = torch.tensor([[tokenizer.eos_token_id] + ids[:-1]])
                with torch.no_grad():
                    logprobs = torch.log_softmax(model(inputs).logits[0].double(), dim=-1)
                total = float(logprobs[torch.arange(len(ids)), torch.tensor(ids)].sum())
                entry = sums.setdefault(document["meta"]["pile_set_name"], [0.0, 0, 0, 0])
                for index, value in enumerate((total, len(ids), len(document["text"].encode("utf-8")), 1)):
                    entry[index] += value
    return sums


def main(hf_dir, tasks, include_path, documents_files, output):
    result = harness(hf_dir, tasks, include_path)
    result["documents"] = document_sums(hf_dir, documents_files.split(","))
    with open(output, "w") as handle:
        json.dump(result, handle, default=str)


if __name__ == "__main__":
    main(*sys.argv[1:])
