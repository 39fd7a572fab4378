"""AdamW with linear warmup + cosine decay, and a dynamic loss scale for float16.

Our own small optimizer instead of Keras's: the Keras optimizer API and its checkpoint
layout changed between TF 2.6 and TF 2.11 (and again with tf_keras), and the training loop
must behave identically on all of them. Slots are created eagerly at construction, so a
checkpoint can be restored and broadcast before the first step.
"""
import math

from lm.compat import tf


def learning_rate_at(step, peak, warmup_steps, total_steps, min_lr_ratio):
    """Learning rate for 0-based optimizer step `step` (a number or a tensor).

    Linear warmup to `peak` over `warmup_steps`, then cosine decay to `peak * min_lr_ratio`
    at `total_steps`, flat after.
    """
    step = tf.cast(step, tf.float32)
    warmup = float(max(warmup_steps, 0))
    decay = float(max(total_steps - warmup_steps, 1))
    warm = peak * (step + 1.0) / max(warmup, 1.0)
    progress = tf.clip_by_value((step - warmup) / decay, 0.0, 1.0)
    cosine = 0.5 * (1.0 + tf.cos(math.pi * progress))
    decayed = peak * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine)
    return tf.where(step < warmup, warm, decayed)


def _state_variable(initial, name):
    # ONLY_FIRST_REPLICA: under MWMS every replica assigns the same value in replica context.
    return tf.Variable(initial, trainable=False, name=name,
                       aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter), decay on matrices only.

    Variables with two or more dimensions (kernels, embeddings) are decayed; biases and
    LayerNorm parameters are not. Create it in `Strategy.scope()` after the model is built.
    """

    def __init__(self, variables, schedule, beta_1=0.9, beta_2=0.95, epsilon=1e-8, weight_decay=0.1):
        self.schedule = schedule
        self.beta_1, self.beta_2, self.epsilon, self.weight_decay = beta_1, beta_2, epsilon, weight_decay
        self.step = _state_variable(tf.constant(0, tf.int64), "adamw/step")
        self._slots = {}
        for index, variable in enumerate(variables):
            self._slots[id(variable)] = (
                tf.Variable(tf.zeros(variable.shape, tf.float32), trainable=False, name="adamw/m%d" % index),
                tf.Variable(tf.zeros(variable.shape, tf.float32), trainable=False, name="adamw/v%d" % index),
                len(variable.shape) >= 2,
            )
        self._order = [id(variable) for variable in variables]

    @property
    def variables(self):
        """Every state variable, in a fixed order: step, then (m, v) per model variable."""
        state = [self.step]
        for key in self._order:
            state.extend(self._slots[key][:2])
        return state

    @property
    def learning_rate(self):
        """The rate the next step will use."""
        return self.schedule(self.step)

    def apply_gradients(self, grads, variables, apply=None):
        """One update. `apply` (a bool tensor) False leaves everything, the step included, unchanged.

        In a replica context of a `tf.distribute` strategy the update runs once per device
        through `merge_call`, with the gradients each replica already all-reduced.
        """
        if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
            return tf.distribute.get_replica_context().merge_call(
                self._distributed_apply, args=(list(grads), list(variables), apply))
        if apply is None:
            return self._apply(grads, variables)
        return tf.cond(apply, lambda: self._apply(grads, variables), lambda: tf.constant(False))

    def _distributed_apply(self, strategy, grads, variables, apply):
        # extended.update hands `update` each device's own component of the variable; the
        # slots and the step, read and assigned through their mirrored handles inside it,
        # resolve to the same device's component.
        lr = self.learning_rate
        t = tf.cast(self.step + 1, tf.float32)
        flags = apply if apply is not None else tf.constant(True)
        for grad, variable in zip(grads, variables):
            m, v, decay = self._slots[id(variable)]

            def update(component, grad, flag, m=m, v=v, decay=decay):
                return tf.cond(flag, lambda: self._assign(component, grad, m, v, decay, lr, t),
                               lambda: tf.constant(False))

            strategy.extended.update(variable, update, args=(grad, flags), group=False)
        strategy.extended.update(
            self.step, lambda step, flag: step.assign_add(tf.cast(flag, tf.int64)), args=(flags,), group=False)
        return tf.constant(True)

    def _apply(self, grads, variables):
        lr = self.learning_rate
        t = tf.cast(self.step + 1, tf.float32)
        for grad, variable in zip(grads, variables):
            m, v, decay = self._slots[id(variable)]
            self._assign(variable, grad, m, v, decay, lr, t)
        self.step.assign_add(1)
        return tf.constant(True)

    def _assign(self, variable, grad, m, v, decay, lr, t):
        # One fused kernel (ResourceApplyAdam) for the moments and the step: one pass over the
        # weight, m, v and the gradient instead of a dozen elementwise ops. Its update,
        # lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps'), is ours,
        # lr m_hat / (sqrt(v_hat) + eps), with eps' = eps sqrt(1 - b2^t).
        # The decoupled decay lr wd w uses the weight before the step, so it is applied first.
        if decay and self.weight_decay:
            variable.assign_sub(variable * (lr * self.weight_decay))
        beta_1_power, beta_2_power = tf.pow(self.beta_1, t), tf.pow(self.beta_2, t)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=m.handle, v=v.handle, beta1_power=beta_1_power, beta2_power=beta_2_power,
            lr=lr, beta1=tf.constant(self.beta_1), beta2=tf.constant(self.beta_2),
            epsilon=self.epsilon * tf.sqrt(1.0 - beta_2_power), grad=tf.cast(grad, tf.float32))
        return tf.constant(True)


class DynamicLossScale:
    """float16 loss scaling: halve on inf/nan gradients, double after `growth_interval` good steps."""

    def __init__(self, initial=2.0 ** 15, growth_interval=2000):
        self.growth_interval = growth_interval
        self.value = _state_variable(tf.constant(initial, tf.float32), "loss_scale/value")
        self.good_steps = _state_variable(tf.constant(0, tf.int64), "loss_scale/good_steps")

    @property
    def variables(self):
        return [self.value, self.good_steps]

    def scale(self, loss):
        return loss * self.value

    def unscale(self, grads):
        return [tf.cast(grad, tf.float32) / self.value for grad in grads]

    def update(self, finite):
        good = tf.where(finite, self.good_steps + 1, tf.zeros_like(self.good_steps))
        grow = good >= self.growth_interval
        value = tf.where(finite, tf.where(grow, self.value * 2.0, self.value), tf.maximum(self.value / 2.0, 1.0))
        self.value.assign(value)
        self.good_steps.assign(tf.where(grow, tf.zeros_like(good), good))
