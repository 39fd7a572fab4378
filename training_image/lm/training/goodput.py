"""Where a training job's time goes, and when it saves with `checkpoint_every: "auto"`.

`Ledger`: the job's time in buckets, cumulative over the processes of one job (a spot interruption
restarts the same job on a new instance, which resumes from the newest checkpoint):
- start-up: from the process's start to the end of its first step (which compiles);
- kept steps: the steps the final state holds, each counted once (a step's time runs from the batch's
  read to the end of its hook, less the saves and evaluations inside it);
- redone: the steps an interruption lost (trained after the newest checkpoint, trained again after it), and
  those a rollback of the divergence defense threw away (`rolled_back`);
- saves, evaluation, and the end (from the last step: the export, the data stream's end);
and the process's whole time, which these parts fill: it is cut at marks, each step's end, and what lies between
two marks is the step's, less the saves and evaluations inside it.
At every save the totals go into the checkpoint (`record`), and at every log window the chief writes them to
PROGRESS_FILE beside the checkpoints (SageMaker syncs that directory to S3, as the checkpoints): a restart
reads the checkpoint's totals, and from the progress file the steps and seconds trained after it, which
it redoes. Time after the last progress write before an interruption is not counted by the job: it shows
as the difference between the billed time and the job's own (the report's "outside the job's count").
The chief logs the totals at every save and at the end (`lm.spec.job.format_goodput_log`), so SageMaker's
final metrics hold them whether the job completed, failed or was stopped.

`AutoInterval`: with `checkpoint_every: "auto"` the job saves every Young/Daly interval of training
(`lm.spec.interruptions`), planned from the checkpoint's size, then re-planned from the first save's
measured time; `checkpoint_minutes` saves sooner when it is shorter.
"""
import json
import os
import time

from lm.spec import interruptions, job

PROGRESS_FILE = "goodput.json"
SECONDS = ("kept_step_seconds", "startup_seconds", "save_seconds", "eval_seconds", "redone_seconds", "end_seconds",
           "process_seconds")
# Besides: every step's time but the start-ups', kept or not: kept + redone + what is not saved yet.
STEP_SECONDS = "step_seconds"


class Ledger:
    """The job's time (the module docstring); `job_name` tells this job's checkpoints from another's.

    The process's time is cut at marks: each step's end (`step_done`) and the end (`ended`); what lies between two
    marks is the step's (or the start-up's, or the end's) less the saves and evaluations inside it."""

    def __init__(self, job_name, tokens_per_step, directory, process_start, clock=time.monotonic):
        self.job_name, self.tokens_per_step, self.directory = job_name, tokens_per_step, directory
        self.clock, self.process_start = clock, process_start
        self.carried = dict.fromkeys(SECONDS + (STEP_SECONDS,), 0.0)  # earlier processes of this job
        self.mine = dict.fromkeys(SECONDS + (STEP_SECONDS,), 0.0)
        self.redone_steps = 0
        self.first_step = 0  # the step this job started from (another job's checkpoint: resume_from)
        self.unsaved_seconds = 0.0  # step time since the newest save
        self.start = {"resumed": 0, "resumed_from_step": 0, "steps_lost": 0, "process_startup_seconds": 0.0}
        self.started = False
        self.mark = process_start
        self.inside = 0.0  # saves and evaluations since the mark

    def resumed(self, meta, step):
        """The process restored the checkpoint of `step` (its `meta`): continue this job's counts."""
        self.start.update(resumed=1, resumed_from_step=step)
        recorded = meta.get("goodput") or {}
        if not self.job_name or recorded.get("job") != self.job_name:
            self.first_step = step  # another job's checkpoint: this job's count starts here
            return
        self.first_step = recorded["first_step"]
        progress = self.read_progress()
        if not (progress and progress["job"] == self.job_name and progress["step"] >= step):
            progress = recorded  # no later count: the checkpoint's
        self.start["steps_lost"] = progress["step"] - step
        self.redone_steps = progress["redone_steps"] + self.start["steps_lost"]
        # What was trained after this checkpoint is redone; every other second counted stays as counted.
        self.carried.update(progress["seconds"])
        self.carried["kept_step_seconds"] = recorded["seconds"]["kept_step_seconds"]
        self.carried["redone_seconds"] = progress["seconds"][STEP_SECONDS] - self.carried["kept_step_seconds"]

    def rolled_back(self, meta, from_step, to_step):
        """The divergence defense restored the checkpoint of `to_step` (its `meta`) at `from_step`: the steps after
        it, saved or not, are thrown away, so they count as redone, not kept."""
        recorded = meta.get("goodput") or {}
        kept_then = recorded["seconds"]["kept_step_seconds"] if recorded.get("job") == self.job_name else 0.0
        saved_since = self.carried["kept_step_seconds"] + self.mine["kept_step_seconds"] - kept_then
        self.mine["kept_step_seconds"] -= saved_since
        self.mine["redone_seconds"] += saved_since + self.unsaved_seconds
        self.unsaved_seconds = 0.0
        self.redone_steps += from_step - to_step

    def read_progress(self):
        try:
            with open(os.path.join(self.directory, PROGRESS_FILE)) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None

    def _since_mark(self):
        now = self.clock()
        seconds = now - self.mark - self.inside
        self.mark, self.inside = now, 0.0
        return seconds

    def step_done(self):
        """A step ended: its time since the last mark (the process's first: its start-up, which compiles)."""
        seconds = self._since_mark()
        if not self.started:
            self.started = True
            self.mine["startup_seconds"] = self.start["process_startup_seconds"] = seconds
            return
        self.unsaved_seconds += seconds
        self.mine[STEP_SECONDS] += seconds

    def commit(self):
        """A save begins: the steps since the last one are kept from now on."""
        self.mine["kept_step_seconds"] += self.unsaved_seconds
        self.unsaved_seconds = 0.0

    def saved(self, seconds):
        self.inside += seconds
        self.mine["save_seconds"] += seconds

    def evaluated(self, seconds):
        self.inside += seconds
        self.mine["eval_seconds"] += seconds

    def ended(self):
        """The process's training is over: its time since the last step (export, the data stream's end)."""
        self.mine["end_seconds"] += self._since_mark()

    def seconds(self):
        self.mine["process_seconds"] = self.clock() - self.process_start
        return {name: self.carried[name] + self.mine[name] for name in self.mine}

    def totals(self, step):
        """The line's values at `step` (`lm.spec.job.GOODPUT_TOTALS`)."""
        totals = self.seconds()
        del totals[STEP_SECONDS]
        kept = step - self.first_step
        totals.update(kept_steps=kept, kept_tokens=kept * self.tokens_per_step,
                      trained_tokens=(kept + self.redone_steps) * self.tokens_per_step, redone_steps=self.redone_steps)
        return totals

    def record(self, step):
        """What a checkpoint of `step` holds of the ledger (written with the save), and the progress file."""
        return {"job": self.job_name, "first_step": self.first_step, "step": step, "seconds": self.seconds(),
                "redone_steps": self.redone_steps}

    def write_progress(self, step):
        """The counts as of `step` beside the checkpoints (atomically: a kill leaves the previous one)."""
        record = self.record(step)
        path = os.path.join(self.directory, PROGRESS_FILE)
        os.makedirs(self.directory, exist_ok=True)
        with open(path + ".tmp", "w") as handle:
            json.dump(record, handle)
        os.replace(path + ".tmp", path)

    def start_line(self):
        return job.format_goodput_start_log(self.start)


class AutoInterval:
    """checkpoint_every "auto": seconds of training between saves (the module docstring)."""

    def __init__(self, save_seconds, interruption_hours, instance_count, gpus_per_host, checkpoint_minutes):
        # The gate writes the run's default (spot or on demand) into interruption_hours; a run by hand without it
        # gets the on-demand default.
        self.mtbi = interruptions.job_mtbi_seconds(instance_count, False, gpus_per_host, interruption_hours)
        self.cap = checkpoint_minutes * 60.0
        self.measured = False
        self.plan(save_seconds)

    def plan(self, save_seconds):
        self.save_seconds = save_seconds
        self.interval = interruptions.young_daly_seconds(save_seconds, self.mtbi)
        return self.seconds()

    def seconds(self):
        """The interval the save clock keeps: Young/Daly's, or checkpoint_minutes when sooner."""
        return min(self.interval, self.cap) if self.cap else self.interval

    def first_save(self, seconds):
        """Re-plan with the first save's measured time; True when this was it."""
        if self.measured:
            return False
        self.measured = True
        self.plan(seconds)
        return True

    def described(self, basis):
        return ("checkpoint_every auto: a save every %.1f s of training (Young/Daly: a %.2f s save %s, an "
                "interruption every %.0f s of the job%s)" % (
                    self.seconds(), self.save_seconds, basis, self.mtbi,
                    "; checkpoint_minutes is sooner" if self.seconds() < self.interval else ""))
