"""Batched generation: with a key/value cache, or by full recomputation (the reference).

Prompts of different lengths are left-padded into one batch; the model masks the padding
and gives each prompt the positions it would have alone. Sampling runs on the host in
float64 from a seeded NumPy generator, so the cached and the recomputing paths draw the same
tokens from the same logits, and padded vocabulary ids are never drawn.

A model generates through `model.decode(tokens, valid, caches=None, index=0)`; one whose family
declares the capability `kv_cache` (`lm.spec.families`) also has `init_cache(batch, length)` (see
`lm.models.gpt.GPT`). Others (the RNN family) always recompute.
"""
import weakref
from typing import Callable, List, Optional, Sequence

import numpy as np

from lm.compat import tf
from lm.tokenizer import EOD_TOKEN
from lm.spec.families import get_family

__all__ = ["Generator", "generate_tokens", "sample"]


def _check_options(max_new_tokens, temperature, top_k, top_p):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError("max_new_tokens must be an integer >= 0, got %r" % (max_new_tokens,))
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ValueError("temperature must be a number >= 0 (0 = greedy), got %r" % (temperature,))
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError("top_k must be an integer >= 0 (0 = off), got %r" % (top_k,))
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError("top_p must be a number in (0, 1] (1 = off), got %r" % (top_p,))


def sample(logits, vocab_size, temperature, top_k, top_p, rng):
    """Next token per row of `logits` [batch, padded_vocab], among the first `vocab_size` ids."""
    logits = np.asarray(logits, np.float64)[:, :vocab_size]
    if temperature == 0:
        return np.argmax(logits, axis=-1)
    logits = logits / temperature
    if 0 < top_k < vocab_size:
        kth = np.partition(logits, -top_k, axis=-1)[:, -top_k, np.newaxis]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p < 1:
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        # Keep the most likely tokens until their mass reaches top_p (always at least one).
        drop_sorted = np.cumsum(sorted_probs, axis=-1) - sorted_probs >= top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        probs = np.where(drop, 0.0, probs)
    cumulative = np.cumsum(probs, axis=-1)
    draws = rng.random(len(probs)) * cumulative[:, -1]
    chosen = np.array([np.searchsorted(row, draw, side="right") for row, draw in zip(cumulative, draws)])
    return np.minimum(chosen, vocab_size - 1)


_COMPILED = weakref.WeakKeyDictionary()


def _full_step(model):
    """model.decode on the whole sequence -> last logits; traced once for any batch and length."""
    if "full" not in _COMPILED.setdefault(model, {}):
        _COMPILED[model]["full"] = tf.function(
            lambda tokens, valid: model.decode(tokens, valid)[0][:, -1],
            input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.bool)])
    return _COMPILED[model]["full"]


def _cached_step(model, caches):
    """model.decode with caches -> (last logits, caches); traced once for any batch and length."""
    if "cached" not in _COMPILED.setdefault(model, {}):
        def step(tokens, valid, caches, index):
            logits, caches = model.decode(tokens, valid, caches, index)
            return logits[:, -1], caches

        cache_specs = [tuple(tf.TensorSpec([None, t.shape[1], None, t.shape[3]], t.dtype) for t in pair)
                       for pair in caches]
        _COMPILED[model]["cached"] = tf.function(step, input_signature=[
            tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.bool), cache_specs,
            tf.TensorSpec([], tf.int32)])
    return _COMPILED[model]["cached"]


def generate_tokens(model, config, prompt_ids: List[List[int]], max_new_tokens: int, temperature: float = 1.0,
                    top_k: int = 0, top_p: float = 1.0, seed: Optional[int] = None,
                    stop_tokens: Optional[Sequence[int]] = None, use_cache: bool = True,
                    finished: Optional[Callable[[int, List[int]], bool]] = None) -> List[List[int]]:
    """New tokens for each prompt (without the prompt).

    A row ends at `max_new_tokens`, before a token in `stop_tokens`, or when
    `finished(row, new_ids)` returns True (`lm.serving.generate.Generator` checks stop strings so).
    `seed` makes sampling deterministic; temperature 0 is greedy.
    """
    _check_options(max_new_tokens, temperature, top_k, top_p)
    if not prompt_ids:
        return []
    for row, ids in enumerate(prompt_ids):
        if not ids:
            raise ValueError("prompt %d is empty: it needs at least one token" % row)
        bad = [t for t in ids if not 0 <= t < config.vocab_size]
        if bad:
            raise ValueError("prompt %d has token ids outside [0, %d): %s" % (row, config.vocab_size, bad[:5]))
        if len(ids) + max_new_tokens > config.block_size:
            raise ValueError("prompt %d has %d tokens; with max_new_tokens=%d that exceeds the model's context of %d"
                             % (row, len(ids), max_new_tokens, config.block_size))
    stop_tokens = set(stop_tokens or ())
    rng = np.random.default_rng(seed)
    batch, prompt_len = len(prompt_ids), max(len(ids) for ids in prompt_ids)
    total = prompt_len + max_new_tokens
    tokens = np.zeros([batch, total], np.int32)
    valid = np.zeros([batch, total], bool)
    for row, ids in enumerate(prompt_ids):
        tokens[row, prompt_len - len(ids):prompt_len] = ids
        valid[row, prompt_len - len(ids):] = True

    if use_cache and get_family(config.family).supports("kv_cache"):
        caches = model.init_cache(batch, total)
        step = _cached_step(model, caches)
        valid_t = tf.constant(valid)

        def next_logits(length):
            nonlocal caches
            start = 0 if length == prompt_len else length - 1
            logits, caches = step(tf.constant(tokens[:, start:length]), valid_t, caches, tf.constant(start))
            return logits.numpy()
    else:
        full = _full_step(model)

        def next_logits(length):
            return full(tf.constant(tokens[:, :length]), tf.constant(valid[:, :length])).numpy()

    outputs = [[] for _ in prompt_ids]
    done = np.zeros(batch, bool)
    for length in range(prompt_len, total):
        chosen = sample(next_logits(length), config.vocab_size, temperature, top_k, top_p, rng)
        tokens[:, length] = chosen
        for row, token in enumerate(chosen.tolist()):
            if done[row]:
                continue
            if token in stop_tokens:
                done[row] = True
                continue
            outputs[row].append(token)
            if finished is not None and finished(row, outputs[row]):
                done[row] = True
        if done.all():
            break
    return outputs


class Generator:
    """Text in, text out, for the server: `Generator(model, config, tokenizer).generate([...])`.

    Generation ends at the end-of-document token, at `max_new_tokens`, or at the first stop
    string; the returned text is the continuation only, cut before the stop string.
    """

    def __init__(self, model, config, tokenizer):
        self.model, self.config, self.tokenizer = model, config, tokenizer
        self.eod_id = tokenizer.token_to_id(EOD_TOKEN)

    @property
    def context_length(self):
        return self.config.block_size

    def encode(self, prompt):
        """Token ids of a prompt; an empty prompt starts a new document."""
        ids = self.tokenizer.encode(prompt).ids
        if not ids and self.eod_id is not None:
            ids = [self.eod_id]
        return ids

    def generate_tokens(self, prompt_ids, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0, seed=None,
                        stop_tokens=None, use_cache=True, finished=None):
        if stop_tokens is None:
            stop_tokens = [] if self.eod_id is None else [self.eod_id]
        return generate_tokens(self.model, self.config, prompt_ids, max_new_tokens, temperature, top_k, top_p,
                               seed, stop_tokens, use_cache, finished)

    def generate(self, prompts: List[str], max_new_tokens: int, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, seed: Optional[int] = None, stop: Optional[Sequence[str]] = None,
                 use_cache: bool = True) -> List[str]:
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise ValueError("prompts must be a list of strings")
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        if not all(isinstance(s, str) and s for s in stops):
            raise ValueError("stop must be a non-empty string or a list of them, got %r" % (stop,))

        def finished(row, ids):
            text = self.tokenizer.decode(ids)
            return any(s in text for s in stops)

        new_ids = self.generate_tokens([self.encode(p) for p in prompts], max_new_tokens, temperature, top_k,
                                       top_p, seed, use_cache=use_cache, finished=finished if stops else None)
        return [self._cut(self.tokenizer.decode(ids), stops) for ids in new_ids]

    @staticmethod
    def _cut(text, stops):
        positions = [text.find(s) for s in stops if s in text]
        return text[:min(positions)] if positions else text
