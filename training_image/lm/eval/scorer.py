"""Token-level scoring and generation for evaluation, without lm-eval: what `lm.eval.model` (the
lm-eval model) and `lm.eval.pile_bpb` compute with.

A `Scorer` holds a model loaded from an lmstack export (`lm.serving.export`) or a Hugging Face
directory (`lm.hf`), its config and tokenizer. `loglikelihoods` scores (context, continuation) token
pairs in batches, longest first, right-padded: the causal mask keeps padding out of every real
position, so a row scores as it would alone. The log-softmax, the gather of the continuation's
tokens and the greedy check run in the graph (one traced function for every batch shape), so only
[batch, length] numbers leave it, never the [batch, length, vocabulary] logits.
"""
import os

import numpy as np

from lm.compat import tf
from lm.serving import export as lm_export
from lm.serving.generate import generate_tokens
from lm.tokenizer import EOD_TOKEN, eod_id

DEFAULT_BATCH_SIZE = 16


class ModelDirError(ValueError):
    """A model directory that is neither an lmstack export nor a Hugging Face directory."""


def load_model_dir(model_dir):
    """(model, config, tokenizer, end-of-document token id) of an `lm.serving.export` directory
    (model.json) or a Hugging Face directory that `lm.hf` imports (config.json)."""
    if os.path.isfile(os.path.join(model_dir, lm_export.CONFIG_FILE)):
        model, config, tokenizer = lm_export.load_exported(model_dir)
        return model, config, tokenizer, eod_id(tokenizer, EOD_TOKEN, model_dir)
    if os.path.isfile(os.path.join(model_dir, "config.json")):
        from lm import hf

        model, config, tokenizer, eod_token = hf.load_hf(model_dir)
        return model, config, tokenizer, eod_id(tokenizer, eod_token, model_dir)
    raise ModelDirError("pretrained=%s: holds neither %s (an lmstack export, lm.serving.export) nor config.json "
                        "(a Hugging Face directory lm.hf imports)" % (model_dir, lm_export.CONFIG_FILE))


def check_batch_size(batch_size):
    """An integer >= 1; lm-eval passes it as text from the command line ("auto" means the default)."""
    if batch_size in (None, "auto"):
        return DEFAULT_BATCH_SIZE
    try:
        value = int(batch_size)
    except (TypeError, ValueError):
        value = 0
    if value < 1 or isinstance(batch_size, bool) or str(value) != str(batch_size).strip():
        raise ValueError("batch_size must be an integer >= 1 or 'auto' (%d), got %r" % (DEFAULT_BATCH_SIZE, batch_size))
    return value


class Scorer:
    """Log-likelihoods and greedy generation of one model, in batches of `batch_size` rows."""

    def __init__(self, model, config, tokenizer, eod_token_id, batch_size=DEFAULT_BATCH_SIZE):
        self.model, self.config, self.tokenizer = model, config, tokenizer
        self.eod_token_id = eod_token_id
        self.batch_size = check_batch_size(batch_size)
        self._score = self._scoring_function()

    @classmethod
    def from_dir(cls, model_dir, batch_size=DEFAULT_BATCH_SIZE):
        return cls(*load_model_dir(model_dir), batch_size=batch_size)

    @property
    def max_length(self):
        return self.config.block_size

    def encode(self, text):
        return self.tokenizer.encode(text).ids

    def decode(self, ids):
        return self.tokenizer.decode(ids)

    def _scoring_function(self):
        model, vocab_size = self.model, self.config.vocab_size

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32)])
        def score(inputs, targets):
            # Padded vocabulary rows are no tokens: the softmax runs over the real ones, as in the
            # Hugging Face export (which cuts them).
            logits = model(inputs, training=False)[:, :, :vocab_size]
            target_logits = tf.gather(logits, targets, batch_dims=2)
            logprobs = target_logits - tf.reduce_logsumexp(logits, axis=-1)
            greedy = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), targets)
            return logprobs, greedy

        return score

    def loglikelihoods(self, pairs):
        """[(sum of the continuation's token log-probabilities, whether greedy decoding makes it)] for
        (context ids, continuation ids) pairs (both non-empty), in their order. A pair longer than
        the model's context keeps its last max_length + 1 tokens (lm-eval's left truncation)."""
        rows = []
        for context, continuation in pairs:
            if not context or not continuation:
                raise ValueError("a scored pair needs a non-empty context and continuation")
            whole = (list(context) + list(continuation))[-(self.max_length + 1):]
            rows.append((whole, min(len(continuation), len(whole) - 1)))
        order = sorted(range(len(rows)), key=lambda i: (-len(rows[i][0]), rows[i][0]))
        results = [None] * len(rows)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            for index, result in zip(chunk, self._score_batch([rows[i] for i in chunk])):
                results[index] = result
        return results

    def _score_batch(self, rows):
        width = max(len(whole) for whole, _ in rows) - 1
        inputs = np.zeros([len(rows), width], np.int32)
        targets = np.zeros([len(rows), width], np.int32)
        for row, (whole, _) in enumerate(rows):
            inputs[row, :len(whole) - 1] = whole[:-1]
            targets[row, :len(whole) - 1] = whole[1:]
        logprobs, greedy = self._score(tf.constant(inputs), tf.constant(targets))
        logprobs, greedy = logprobs.numpy().astype(np.float64), greedy.numpy()
        results = []
        for row, (whole, scored) in enumerate(rows):
            end = len(whole) - 1
            results.append((float(logprobs[row, end - scored:end].sum()), bool(greedy[row, end - scored:end].all())))
        return results

    def rolling_loglikelihoods(self, token_lists):
        """Log-likelihood of each whole token list, in windows of the model's context as lm-eval's
        models make them (`lm_eval.utils.get_rolling_token_windows`: the first window conditions on the
        end-of-document token, each later one on the tokens before it)."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        windows, owners = [], []
        for owner, tokens in enumerate(token_lists):
            for window in get_rolling_token_windows(token_list=list(tokens), prefix_token=self.eod_token_id,
                                                    max_seq_len=self.max_length, context_len=1):
                windows.append(make_disjoint_window(window))
                owners.append(owner)
        totals = [0.0] * len(token_lists)
        for owner, (logprob, _) in zip(owners, self.loglikelihoods(windows)):
            totals[owner] += logprob
        return totals

    def generate(self, prompts, max_gen_toks, stops, temperature=0.0, top_k=0, top_p=1.0, seed=None):
        """The continuation of each prompt text: greedy (temperature 0) or sampled, with the KV cache,
        until the end-of-document token, `max_gen_toks` tokens or a stop string (cut before it).
        A prompt keeps its last max_length - max_gen_toks tokens."""
        keep = self.max_length - max_gen_toks
        if keep < 1:
            raise ValueError("max_gen_toks %d leaves no room for a prompt in the model's context of %d" % (
                max_gen_toks, self.max_length))
        prompt_ids = [(self.encode(p) or [self.eod_token_id])[-keep:] for p in prompts]

        def finished(row, ids):
            text = self.decode(ids)
            return any(stop in text for stop in stops)

        order = sorted(range(len(prompts)), key=lambda i: -len(prompt_ids[i]))
        results = [None] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            new_ids = generate_tokens(self.model, self.config, [prompt_ids[i] for i in chunk], max_gen_toks,
                                      temperature, top_k, top_p, seed, stop_tokens=[self.eod_token_id],
                                      finished=finished if stops else None)
            for index, ids in zip(chunk, new_ids):
                results[index] = cut_at_stops(self.decode(ids), stops)
        return results


def cut_at_stops(text, stops):
    """The text before the first stop string in it."""
    positions = [text.find(stop) for stop in stops if stop and stop in text]
    return text[:min(positions)] if positions else text
