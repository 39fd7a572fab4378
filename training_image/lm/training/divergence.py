"""A diverging run defends itself: non-finite steps are skipped, loss spikes rolled back past their data.

Non-finite steps. The train step applies its update only when the all-reduced loss and the global
gradient norm are finite (`lm.distributed.base.apply_update`: every rank decides on the same reduced
values, so all agree; under SMP on the pipeline's reduced loss and the model-parallel norm). The loop
counts each skipped step and logs it with its data position; `nonfinite_limit` consecutive ones roll back.
Under fp16 a gradient overflow is the loss scale's business (it halves and the step is skipped, as
always); only a non-finite loss counts there.

Loss spikes (`spike_detection`). `LossWatch` keeps the last `spike_window` losses of applied steps and
their median and spread (1.4826 times the median absolute deviation, at least `MIN_SPREAD` of the median,
so a flat run's tiny spread does not make noise a spike). A loss above median + `spike_threshold` spreads
is high; `spike_steps` high steps in a row are a spike. Warm-up does not fire: the loss falls there, and
nothing is judged before `MIN_HISTORY` losses are known. High losses do not enter the window; a rollback keeps
it (the losses before the spike are still the reference).

Rollback. The loss of step s is that of the weights after step s - 1, so a spike whose first high loss is
at step s0 began with the update of step s0 - 1: every rank restores the newest kept checkpoint of a step
before s0 - 1 (the strategies keep the last two), discards the newer ones, and skips the data window from
that checkpoint's position to at least `rollback_skip` batches on, and past the batch that showed the spike.
The window's batches are never read again: every later data position is offset by the batches skipped so
far (`data_offset`), which each checkpoint records with the windows, and the checkpoint is saved again at
once with them, so a spot restart resumes after the window. At most `max_rollbacks` per run: one more
saves and stops the job (exit status 4), its failure reason naming the steps and data positions.

The cost per step: the two scalars (loss, applied) the decision reads from the device, and a deque's median.

Drills. `LMSTACK_FAULTS` in the training job's environment (never a hyperparameter; the state machine sets it
only for an input's `drill.faults`) causes these on purpose: `lr_spike@STEP[xFACTOR]` (that step's learning rate
times FACTOR, default 1000), `nan@STEP` (that step's loss NaN, and so its gradients), `spike@STEP:COUNT` (the
loss the loop sees for COUNT steps from STEP multiplied, the gradients untouched). STEP is the step number of the
log lines (1-based). A fault fires once: not again when a rollback replays its step.
"""
import collections

import numpy as np

from lm.spec import drill, job

# What spike@ multiplies the loss by: above any threshold a run's noise allows.
SPIKE_FACTOR = 10.0
MIN_SPREAD = 0.01  # of the median
MIN_HISTORY = 16  # losses known before any is judged


class Faults:
    """The drill's faults, applied through two variables the train step reads (made only when there are
    faults: a run without LMSTACK_FAULTS has no extra op)."""

    def __init__(self, tf, text):
        self.tf = tf
        self.faults = drill.parse_faults(text)
        self.lr_factor = tf.Variable(1.0, trainable=False, name="faults/lr_factor")
        self.loss_factor = tf.Variable(1.0, trainable=False, name="faults/loss_factor")

    def schedule(self, schedule):
        return lambda step: schedule(step) * self.lr_factor

    def loss(self, loss_fn):
        return lambda labels, logits: loss_fn(labels, logits) * self.loss_factor

    def before(self, step, fresh):
        """Arm the faults of 1-based `step`; `fresh(step)`: whether no rollback replays the fault at `step`."""
        self.lr_factor.assign(self.faults["lr"][step] if step in self.faults["lr"] and fresh(step) else 1.0)
        self.loss_factor.assign(float("nan") if step in self.faults["nan"] and fresh(step) else 1.0)

    def seen_loss(self, step, loss, fresh):
        """The loss the loop judges: spike@'s multiplied while its steps last (and no rollback went past its start)."""
        for first, count in self.faults["spike"].items():
            if first <= step < first + count and fresh(first):
                return loss * SPIKE_FACTOR
        return loss


class LossWatch:
    """The median and spread of the last `window` losses; `high(loss)` against them."""

    def __init__(self, window, threshold):
        self.losses = collections.deque(maxlen=window)
        self.threshold = threshold

    def high(self, loss):
        if len(self.losses) < MIN_HISTORY:
            return False
        values = np.fromiter(self.losses, float)
        median = float(np.median(values))
        spread = max(1.4826 * float(np.median(np.abs(values - median))), MIN_SPREAD * abs(median))
        return loss > median + self.threshold * spread

    def add(self, loss):
        self.losses.append(loss)


class Divergence:
    """The loop's defense: `observe` each step's two scalars; the record a checkpoint keeps (`record`,
    `resume`). Returns what to do: None, or the step a rollback must start before."""

    def __init__(self, hp):
        self.hp = hp
        self.watch = LossWatch(hp.spike_window, hp.spike_threshold)
        self.skipped_steps = 0
        self.nonfinite_run = []  # consecutive non-finite steps
        self.high_run = []  # consecutive high-loss steps
        self.rollbacks = []  # {"step", "to_step", "skip": [first, end)} per rollback
        self.data_offset = 0

    def fresh(self, step):
        """Whether `step` runs for the first time (no rollback replays it): faults fire only then."""
        return all(step > rollback["step"] for rollback in self.rollbacks)

    def observe(self, step, loss, applied):
        """(event, first step of the trouble): event None, "skipped" or "rollback"."""
        if not applied:
            self.skipped_steps += 1
            self.nonfinite_run.append(step)
            self.high_run = []
            if len(self.nonfinite_run) >= self.hp.nonfinite_limit:
                return "rollback", self.nonfinite_run[0]
            return "skipped", step
        self.nonfinite_run = []
        if self.hp.spike_detection and self.watch.high(loss):
            self.high_run.append(step)
            if len(self.high_run) >= self.hp.spike_steps:
                return "rollback", self.high_run[0]
            return None, step
        self.high_run = []
        self.watch.add(loss)
        return None, step

    def target(self, kept_steps, began):
        """The newest kept checkpoint whose weights precede the trouble that began at step `began`: the loss
        of step s is of the weights after step s - 1, so the checkpoint's step is below began - 1."""
        earlier = [step for step in kept_steps if step < began - 1]
        return earlier[-1] if earlier else None

    def roll_back(self, detected, to_step, position_of):
        """Record the rollback of the trouble detected at `detected` to the checkpoint of `to_step`;
        `position_of(step)` is the data position (batches from the start) of a step before it."""
        first = position_of(to_step)
        end = max(first + self.hp.rollback_skip, position_of(detected))
        self.rollbacks.append({"step": detected, "to_step": to_step, "skip": [first, end]})
        self.data_offset += end - first
        self.nonfinite_run, self.high_run = [], []
        return first, end

    def too_many(self):
        return len(self.rollbacks) > self.hp.max_rollbacks

    def record(self):
        """What a checkpoint keeps, so a restart neither replays a window nor forgets its rollbacks."""
        return {"data_offset": self.data_offset, "rollbacks": list(self.rollbacks), "skipped_steps": self.skipped_steps}

    def resume(self, meta):
        recorded = meta.get("divergence") or {}
        self.data_offset = int(recorded.get("data_offset", 0))
        self.rollbacks = list(recorded.get("rollbacks", []))
        self.skipped_steps = int(recorded.get("skipped_steps", 0))


# ---- the loop's hooks (lm.training.train.Training calls them) ----

def defend(training, metrics):
    """After the step `training.step` was counted: judge its loss and whether it was applied; log a skipped
    step, roll back a spike. Returns True when it rolled back (the loop reopens the data stream)."""
    guard, step = training.divergence, training.step
    loss = float(metrics["loss"])
    if training.faults is not None:
        loss = training.faults.seen_loss(step, loss, guard.fresh)
    metrics["loss"] = loss  # fetched once: the log window reads it too
    event, began = guard.observe(step, loss, float(metrics["applied"]) > 0.0)
    if event == "skipped":
        log(training, "skipped", step, "loss=%s (not finite: the update was not applied)" % loss)
    if event != "rollback":
        return False
    roll_back(training, step, began)
    return True


def log(training, event, step, detail, position=None):
    """The [divergence] line of `event` at `step` (its batch's data position unless `position` is given)."""
    guard = training.divergence
    position = training.data_position(step - 1) if position is None else position
    epoch, batch = training.train_stream.position(position)
    training.say(job.format_divergence_log(event, step, epoch, batch, guard.skipped_steps, len(guard.rollbacks),
                                           detail))
    training.tensorboard.divergence(step, guard.skipped_steps, len(guard.rollbacks))


def roll_back(training, detected, began):
    """Every rank restores the checkpoint before step `began` - 1 (rank 0's choice), discards the newer ones,
    skips the data window and saves the checkpoint again with it; past max_rollbacks, stops the run
    (`training.diverged`, the job's failure reason)."""
    guard, strategy, checkpoints = training.divergence, training.strategy, training.checkpoints
    checkpoints.wait()
    target = strategy.choose_checkpoint(guard.target(checkpoints.kept_steps(), began) if strategy.is_chief else None)
    trouble = "%s from step %d to step %d" % (
        "non-finite steps" if len(guard.nonfinite_run) >= training.hp.nonfinite_limit else "a loss spike",
        began, detected)
    if target is None:
        training.diverged = ("the run diverged (%s) and no checkpoint before step %d is kept to roll back to; "
                             "nothing was saved" % (trouble, began - 1))
        log(training, "stopped", detected, trouble)
        return
    detected_position = training.data_position(detected - 1)
    if strategy.writes_checkpoints:
        checkpoints.restore(target, training.state)
    strategy.broadcast_restored_state(training.model, training.optimizer)
    first, end = guard.roll_back(detected, target, training.data_position)
    if strategy.writes_checkpoints:
        training.ledger.rolled_back(checkpoints.read_meta(target), training.step, target)
    training.step = target
    checkpoints.discard_after(target)
    strategy.barrier()
    training.save(target)
    windows = "; ".join("step %d rolled back to %d, batches %d-%d skipped" % (
        rollback["step"], rollback["to_step"], rollback["skip"][0], rollback["skip"][1] - 1)
        for rollback in guard.rollbacks)
    log(training, "rollback", detected, "%s: restored the checkpoint of step %d, skipping batches %d-%d"
        % (trouble, target, first, end - 1), detected_position)
    if guard.too_many():
        training.diverged = ("the run diverged more than max_rollbacks=%d times (%s); the checkpoint of step %d "
                             "before the last is saved" % (training.hp.max_rollbacks, windows, target))
