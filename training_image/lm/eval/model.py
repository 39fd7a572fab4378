"""lmstack's model for lm-evaluation-harness (lm-eval 0.4.13), registered as `lmstack`:

    lm_eval --model lmstack --model_args pretrained=DIR --tasks ...   (once `model_class()` has run:
    python -m lm.eval.harness is lm_eval's command line that runs it first; python -m lm.eval too)

DIR is an lmstack export (`lm.serving.export`: the training job's model) or a Hugging Face directory
that `lm.hf` imports. The three request types follow lm-eval's `hf` model (lm_eval/models/huggingface.py),
so both give the same numbers on the same model: loglikelihood scores the continuation after the
context, the end-of-document token standing for an empty context (`TemplateLM.loglikelihood`);
loglikelihood_rolling sums the windows `lm_eval.utils.get_rolling_token_windows` makes; generate_until
decodes greedily (sampling when a task asks) with the KV cache until a stop string, the
end-of-document token or max_gen_toks (256 unless the task says).

lm-eval needs Python >= 3.10 and is installed only in the image that evaluates: this module imports it
in `model_class()` alone, so the image's other Pythons import the module (tests/image) and the
class is made where lm-eval is.
"""
from lm.eval.scorer import DEFAULT_BATCH_SIZE, Scorer

MODEL_NAME = "lmstack"
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's HFLM.max_gen_toks

_CLASS = []


class LMStackMethods:
    """What lmstack's lm-eval model implements; `model_class()` puts it before lm-eval's TemplateLM."""

    backend = "causal"

    def __init__(self, pretrained, batch_size=DEFAULT_BATCH_SIZE, max_batch_size=None, device=None, **unused):
        super().__init__()
        if unused:
            raise ValueError("model_args %s: the lmstack model takes pretrained=DIR and batch_size=N" % (
                ", ".join(sorted(unused)),))
        self.scorer = Scorer.from_dir(pretrained, batch_size)
        self.pretrained = pretrained

    @property
    def eot_token_id(self):
        return self.scorer.eod_token_id

    @property
    def prefix_token_id(self):
        return self.scorer.eod_token_id

    @property
    def max_length(self):
        return self.scorer.max_length

    @property
    def tokenizer_name(self):
        return "lmstack-" + self.scorer.config.family

    def chat_template(self, chat_template=False):
        return None

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.scorer.encode(string)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        # A context of whitespace alone reaches here empty: lm-eval's _encode_pair moves trailing whitespace into the
        # continuation. It stands for no context, as "" does in TemplateLM.loglikelihood: the prefix token.
        results = self.scorer.loglikelihoods([(context or [self.prefix_token_id], continuation)
                                              for _, context, continuation in requests])
        for (request, _, _), result in zip(requests, results):
            if request is not None:
                self.cache_hook.add_partial("loglikelihood", request, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        strings = [request.args[0] for request in requests]
        totals = self.scorer.rolling_loglikelihoods([self.scorer.encode(text) for text in strings])
        for text, total in zip(strings, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return totals

    def generate_until(self, requests, disable_tqdm=False):
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

        groups = {}
        for index, request in enumerate(requests):
            context, gen_kwargs = request.args
            groups.setdefault(repr(sorted(gen_kwargs.items())), []).append((index, context, gen_kwargs))
        results = [None] * len(requests)
        for group in groups.values():
            kwargs = normalize_gen_kwargs(group[0][2], DEFAULT_MAX_GEN_TOKS)
            stops = handle_stop_sequences(kwargs.pop("until", None), eos=self.scorer.tokenizer.id_to_token(
                self.scorer.eod_token_id))
            sampling = _sampling_options(kwargs)
            texts = self.scorer.generate([context for _, context, _ in group], kwargs["max_gen_toks"], stops,
                                         **sampling)
            for (index, context, gen_kwargs), text in zip(group, texts):
                results[index] = text
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return results

    def get_model_info(self):
        return {"model_family": self.scorer.config.family, "model_num_parameters": self.scorer.model.count_params()}


def _sampling_options(kwargs):
    """generate_tokens' options from lm-eval's normalised generation kwargs; others are refused."""
    known = {"do_sample", "temperature", "top_k", "top_p", "seed", "max_gen_toks"}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ValueError("generation_kwargs %s: the lmstack model takes %s and until" % (
            ", ".join(unknown), ", ".join(sorted(known))))
    if not kwargs.get("do_sample"):
        return {"temperature": 0.0}
    return {"temperature": float(kwargs.get("temperature") or 1.0), "top_k": int(kwargs.get("top_k") or 0),
            "top_p": float(kwargs.get("top_p") or 1.0), "seed": kwargs.get("seed")}


def model_class():
    """lm-eval's model class for lmstack, registered under MODEL_NAME (made on first call)."""
    if not _CLASS:
        from lm_eval.api.model import TemplateLM
        from lm_eval.api.registry import register_model

        _CLASS.append(register_model(MODEL_NAME)(type("LMStackLM", (LMStackMethods, TemplateLM), {
            "__doc__": "lm-eval's model for an lmstack export or a Hugging Face directory lm.hf imports.",
            "__module__": __name__})))
    return _CLASS[0]
