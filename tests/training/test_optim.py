"""lm.training.optim against a NumPy AdamW written from the paper's update rule, and the schedule's shape."""
import numpy as np
import pytest

from lm.compat import tf
from controlplane.presets import get_preset
from lm.spec.families import peak_learning_rate
from lm.training.optim import AdamW, DynamicLossScale, learning_rate_at

# The SMP image's runtime uses these too: tests/tf26 runs them on its framework.
pytestmark = pytest.mark.tf26


def test_schedule_warms_up_linearly_then_decays_by_cosine_to_the_floor():
    rate = lambda step: float(learning_rate_at(step, 1.0, 10, 110, 0.1))  # noqa: E731
    assert rate(0) == pytest.approx(0.1)
    assert rate(4) == pytest.approx(0.5)
    assert rate(9) == pytest.approx(1.0)
    assert rate(10) == pytest.approx(1.0)
    assert rate(60) == pytest.approx(0.55)  # half way: floor + (1 - floor) / 2
    assert rate(110) == pytest.approx(0.1)
    assert rate(500) == pytest.approx(0.1)
    assert all(rate(s) >= rate(s + 1) for s in range(10, 120))


# GPT-3 paper, Table 2.1: learning rate and batch (sequences of 2,048 tokens) per size.
GPT3_TABLE = [("gpt-125m", 6.0e-4, 256), ("gpt-350m", 3.0e-4, 256), ("gpt-760m", 2.5e-4, 256),
              ("gpt-1.3b", 2.0e-4, 512), ("gpt-2.7b", 1.6e-4, 512), ("gpt-6.7b", 1.2e-4, 1024),
              ("gpt-13b", 1.0e-4, 1024)]


@pytest.mark.parametrize("preset, rate, batch", GPT3_TABLE)
def test_default_peak_learning_rate_is_gpt3s_for_the_size_at_any_batch(preset, rate, batch):
    config = get_preset(preset)
    for global_batch in (1, 64, batch // 4, batch, 8 * batch):
        assert peak_learning_rate(config, global_batch) == pytest.approx(rate)


@pytest.mark.parametrize("preset, rate, batch", GPT3_TABLE)
def test_scale_lr_is_the_square_root_rule_downwards_only(preset, rate, batch):
    config = get_preset(preset)
    assert peak_learning_rate(config, batch, scale_lr=True) == pytest.approx(rate)
    assert peak_learning_rate(config, batch // 4, scale_lr=True) == pytest.approx(rate / 2)  # a quarter: half
    assert peak_learning_rate(config, 8 * batch, scale_lr=True) == pytest.approx(rate)  # larger: bounded


def test_gpt_1_3b_at_the_default_batch_keeps_gpt3s_rate():
    # The linear rule gave 2e-4 x 64 / 512 = 2.5e-5, 8x below GPT-3's rate for the size.
    config = get_preset("gpt-1.3b")
    assert peak_learning_rate(config, 64) == pytest.approx(2e-4)
    assert peak_learning_rate(config, 64, scale_lr=True) == pytest.approx(2e-4 / 8 ** 0.5)


def test_a_given_learning_rate_is_scaled_the_same_way_only_when_asked():
    config = get_preset("gpt-125m")
    assert peak_learning_rate(config, 64, 1e-3, scale_lr=True) == pytest.approx(5e-4)
    assert peak_learning_rate(config, 1024, 1e-3, scale_lr=True) == pytest.approx(1e-3)
    assert peak_learning_rate(config, 64, 1e-3) == pytest.approx(1e-3)
    assert peak_learning_rate(get_preset("tiny"), 64) == pytest.approx(6e-4)  # GPT-3 Small's, the nearest size


def reference_adamw(params, grads_per_step, rates, beta_1=0.9, beta_2=0.95, epsilon=1e-8, decay=0.1):
    params = [p.astype(np.float64) for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t, (grads, lr) in enumerate(zip(grads_per_step, rates), start=1):
        for i, (p, g) in enumerate(zip(params, grads)):
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
            update = (m[i] / (1 - beta_1 ** t)) / (np.sqrt(v[i] / (1 - beta_2 ** t)) + epsilon)
            if p.ndim >= 2:
                update = update + decay * p
            params[i] = p - lr * update
    return params


def test_adamw_matches_the_reference_and_decays_only_matrices():
    rng = np.random.RandomState(0)
    initial = [rng.randn(3, 4).astype(np.float32), rng.randn(4).astype(np.float32)]
    variables = [tf.Variable(value) for value in initial]
    schedule = lambda step: learning_rate_at(step, 0.01, 2, 5, 0.1)  # noqa: E731
    optimizer = AdamW(variables, schedule, weight_decay=0.1)
    grads = [[rng.randn(*value.shape).astype(np.float32) for value in initial] for _ in range(5)]
    for step_grads in grads:
        optimizer.apply_gradients([tf.constant(g) for g in step_grads], variables)
    rates = [float(schedule(step)) for step in range(5)]
    expected = reference_adamw(initial, grads, rates)
    for variable, want in zip(variables, expected):
        np.testing.assert_allclose(variable.numpy(), want, rtol=1e-5, atol=1e-6)
    assert int(optimizer.step) == 5
    assert len(optimizer.variables) == 1 + 2 * len(variables)


def test_zero_gradient_moves_only_decayed_weights():
    matrix, vector = tf.Variable(np.ones((2, 2), np.float32)), tf.Variable(np.ones(2, np.float32))
    optimizer = AdamW([matrix, vector], lambda step: tf.constant(0.5), weight_decay=0.1)
    optimizer.apply_gradients([tf.zeros((2, 2)), tf.zeros(2)], [matrix, vector])
    np.testing.assert_allclose(matrix.numpy(), np.full((2, 2), 1 - 0.5 * 0.1))
    np.testing.assert_allclose(vector.numpy(), np.ones(2))


def test_skipped_update_changes_nothing():
    variable = tf.Variable(np.ones((2, 2), np.float32))
    optimizer = AdamW([variable], lambda step: tf.constant(0.1))
    optimizer.apply_gradients([tf.ones((2, 2))], [variable], apply=tf.constant(False))
    np.testing.assert_array_equal(variable.numpy(), np.ones((2, 2)))
    assert int(optimizer.step) == 0
    assert all(not np.any(state.numpy()) for state in optimizer.variables)


def test_loss_scale_halves_on_overflow_and_grows_after_good_steps():
    scale = DynamicLossScale(initial=8.0, growth_interval=2)
    scale.update(tf.constant(False))
    assert float(scale.value) == 4.0
    scale.update(tf.constant(True))
    assert float(scale.value) == 4.0
    scale.update(tf.constant(True))
    assert float(scale.value) == 8.0
    assert int(scale.good_steps) == 0
    np.testing.assert_allclose(scale.unscale([tf.constant([16.0])])[0].numpy(), [2.0])
