import numpy as np
import pytest

from lm.serving import generate as lm_generate
from lm.models import gpt as lm_model
from lm.compat import keras, tf
from controlplane.presets import get_preset
from lm.tokenizer import EOD_TOKEN, train_bpe

TINY = get_preset("tiny")
PROMPTS = [[5, 17, 3, 99, 42, 7], [11, 2], [300, 301, 302, 303]]


@pytest.fixture(scope="module")
def gpt():
    keras.utils.set_random_seed(11)
    return lm_model.build_model(TINY)


def both_paths(model, prompts, new_tokens, **options):
    cached = lm_generate.generate_tokens(model, TINY, prompts, new_tokens, use_cache=True, **options)
    full = lm_generate.generate_tokens(model, TINY, prompts, new_tokens, use_cache=False, **options)
    return cached, full


def test_left_padded_decode_gives_each_prompt_its_own_logits(gpt):
    padded = np.zeros([2, 6], np.int32)
    padded[0] = PROMPTS[0]
    padded[1, 4:] = PROMPTS[1]
    valid = padded != 0
    valid[0] = True
    logits, _ = gpt.decode(tf.constant(padded), tf.constant(valid))
    alone = gpt(tf.constant([PROMPTS[1]])).numpy()
    np.testing.assert_allclose(logits.numpy()[1, 4:], alone[0], atol=1e-5)
    np.testing.assert_allclose(logits.numpy()[0], gpt(tf.constant([PROMPTS[0]])).numpy()[0], atol=1e-5)


def test_cached_decode_matches_full_logits_step_by_step(gpt):
    sequence = tf.constant([PROMPTS[0] + [8, 9, 10]])
    valid = tf.ones_like(sequence, tf.bool)
    full = gpt(sequence).numpy()
    caches = gpt.init_cache(1, 9)
    logits, caches = gpt.decode(sequence[:, :6], valid, caches, 0)
    np.testing.assert_allclose(logits.numpy(), full[:, :6], atol=1e-5)
    for i in range(6, 9):
        logits, caches = gpt.decode(sequence[:, i:i + 1], valid, caches, i)
        np.testing.assert_allclose(logits.numpy()[:, 0], full[:, i], atol=1e-5)


@pytest.mark.parametrize("options", [
    dict(temperature=0),
    dict(temperature=1.0, seed=3),
    dict(temperature=0.7, top_k=40, seed=4),
    dict(temperature=1.3, top_p=0.9, seed=5),
], ids=["greedy", "sampled", "top-k", "top-p"])
def test_kv_cache_gives_the_same_tokens_as_full_recomputation(gpt, options):
    cached, full = both_paths(gpt, PROMPTS, 24, **options)
    assert [len(row) for row in cached] == [24, 24, 24]
    assert cached == full


def test_the_cache_feeds_one_new_token_per_step(gpt, monkeypatch):
    """The cached path runs the prompt once, then only the newest token each step."""
    seen = []
    real = lm_generate._cached_step

    def spying(model, caches):
        step = real(model, caches)

        def record(tokens, valid, caches, index):
            seen.append((tuple(tokens.shape), int(index)))
            return step(tokens, valid, caches, index)
        return record

    monkeypatch.setattr(lm_generate, "_cached_step", spying)
    lm_generate.generate_tokens(gpt, TINY, PROMPTS, 5, temperature=0)
    assert seen == [((3, 6), 0), ((3, 1), 6), ((3, 1), 7), ((3, 1), 8), ((3, 1), 9)]


def test_batching_does_not_change_a_prompt_s_greedy_tokens(gpt):
    batched = lm_generate.generate_tokens(gpt, TINY, PROMPTS, 12, temperature=0)
    for prompt, row in zip(PROMPTS, batched):
        assert lm_generate.generate_tokens(gpt, TINY, [prompt], 12, temperature=0) == [row]


def test_a_seed_makes_sampling_deterministic(gpt):
    first = lm_generate.generate_tokens(gpt, TINY, PROMPTS, 16, temperature=1.0, seed=9)
    assert lm_generate.generate_tokens(gpt, TINY, PROMPTS, 16, temperature=1.0, seed=9) == first
    assert lm_generate.generate_tokens(gpt, TINY, PROMPTS, 16, temperature=1.0, seed=10) != first


def test_stop_tokens_end_a_row_before_the_stop_token(gpt):
    greedy = lm_generate.generate_tokens(gpt, TINY, [PROMPTS[0]], 10, temperature=0)[0]
    stop = greedy[3]
    first = greedy.index(stop)
    for use_cache in (True, False):
        out = lm_generate.generate_tokens(gpt, TINY, [PROMPTS[0]], 10, temperature=0, stop_tokens=[stop],
                                          use_cache=use_cache)
        assert out == [greedy[:first]]


def test_sampling_never_draws_padded_vocabulary_ids():
    rng = np.random.default_rng(0)
    logits = np.zeros([4, 64])
    logits[:, 50:] = 1e4  # padded ids 50..63 would win everything
    for options in (dict(temperature=0, top_k=0, top_p=1.0), dict(temperature=1.0, top_k=0, top_p=1.0),
                    dict(temperature=2.0, top_k=5, top_p=0.5)):
        for _ in range(20):
            assert (lm_generate.sample(logits, 50, rng=rng, **options) < 50).all()


def test_top_k_and_top_p_restrict_the_candidates():
    rng = np.random.default_rng(1)
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    draws = {int(lm_generate.sample(logits, 4, 1.0, 2, 1.0, rng)[0]) for _ in range(300)}
    assert draws == {0, 1}
    draws = {int(lm_generate.sample(logits, 4, 1.0, 0, 0.75, rng)[0]) for _ in range(300)}
    assert draws == {0, 1}
    draws = {int(lm_generate.sample(logits, 4, 1.0, 0, 1.0, rng)[0]) for _ in range(300)}
    assert draws == {0, 1, 2, 3}
    assert int(lm_generate.sample(logits, 4, 1.0, 0, 0.01, rng)[0]) == 0


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_new_tokens=-1), "max_new_tokens"), (dict(temperature=-0.5), "temperature"),
    (dict(top_k=-2), "top_k"), (dict(top_k=1.5), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
])
def test_bad_options_name_the_field(gpt, kwargs, field):
    options = dict(max_new_tokens=4)
    options.update(kwargs)
    with pytest.raises(ValueError, match=field):
        lm_generate.generate_tokens(gpt, TINY, PROMPTS, **options)


def test_bad_prompts_are_clear_errors(gpt):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        lm_generate.generate_tokens(gpt, TINY, [[1], []], 4)
    with pytest.raises(ValueError, match="outside"):
        lm_generate.generate_tokens(gpt, TINY, [[TINY.vocab_size]], 4)
    with pytest.raises(ValueError, match="context of 128"):
        lm_generate.generate_tokens(gpt, TINY, [[1] * 120], 9)


@pytest.fixture(scope="module")
def tokenizer():
    text = ["the quick brown fox jumps over the lazy dog %d times. " % i for i in range(200)]
    return train_bpe(text, vocab_size=300)


def test_generator_turns_prompts_into_text(gpt, tokenizer):
    generator = lm_generate.Generator(gpt, TINY, tokenizer)
    prompts = ["the quick brown", "", "lazy dog"]
    texts = generator.generate(prompts, max_new_tokens=8, temperature=0)
    assert len(texts) == 3 and all(isinstance(t, str) for t in texts)
    eod = tokenizer.token_to_id(EOD_TOKEN)
    ids = generator.generate_tokens([generator.encode(p) for p in prompts], 8, temperature=0)
    assert texts == [tokenizer.decode(row) for row in ids] and all(eod not in row for row in ids)
    assert generator.encode("") == [eod]
    assert generator.generate(prompts, 8, temperature=0.9, seed=2) == generator.generate(
        prompts, 8, temperature=0.9, seed=2, use_cache=False)


def test_generator_cuts_at_the_first_stop_string(gpt, tokenizer):
    generator = lm_generate.Generator(gpt, TINY, tokenizer)
    full = generator.generate(["the quick"], max_new_tokens=12, temperature=0)[0]
    assert len(full) > 3
    stop = full[2:4]
    cut = generator.generate(["the quick"], max_new_tokens=12, temperature=0, stop=[stop, "\x00never"])[0]
    assert cut == full[:full.index(stop)]
    assert generator.generate(["the quick"], max_new_tokens=12, temperature=0, stop=stop) == [cut]
    with pytest.raises(ValueError, match="stop"):
        generator.generate(["x"], 4, stop=[""])
    with pytest.raises(ValueError, match="list of strings"):
        generator.generate("x", 4)


def test_the_cache_is_used_exactly_where_the_family_declares_kv_cache(gpt, monkeypatch):
    """lm.serving.generate reads the family's declaration (lm.spec.families), not the model: without
    kv_cache it recomputes, with it the cached path runs (init_cache is called)."""
    from lm.spec import families

    calls = []
    monkeypatch.setattr(gpt, "init_cache", lambda *args, init_cache=gpt.init_cache: calls.append(args) or init_cache(*args),
                        raising=False)
    cached = lm_generate.generate_tokens(gpt, TINY, PROMPTS[:1], 3, temperature=0.0)
    assert len(calls) == 1
    declared = families.FAMILIES["gpt"]
    monkeypatch.setitem(families.FAMILIES, "gpt", declared._replace(
        capabilities=tuple(c for c in declared.capabilities if c != "kv_cache")))
    assert lm_generate.generate_tokens(gpt, TINY, PROMPTS[:1], 3, temperature=0.0) == cached
    assert len(calls) == 1
