"""The job's own stop before SageMaker's (`stop_after_seconds`): at its deadline lm.training.train stops after the
last step it can finish and save, saves, and ends the job failed with a reason that says so (SageMaker's stop at
MaxRuntimeInSeconds would kill MPI workers without a save). A restart of the same job carries the seconds it
trained; another job (a new execution's resume_from) has a clock of its own.

The job's clock is `lm.training.train.CLOCK`, replaced here by one that advances a second per reading: the step
at which the deadline falls is then fixed, whatever this machine's speed (no timed assertion)."""
import itertools

from lm.spec import job
from lm import checkpoint
from lm.training import train

from . import helpers
from checkpoint_listing import checkpoint_files

JOB = "lmstack-train-0123456789abcdef0123456789abcdef-1"


def ticking(monkeypatch):
    ticks = itertools.count()
    monkeypatch.setattr(train, "CLOCK", lambda: float(next(ticks)))
    monkeypatch.setattr(train, "PROCESS_START", 0.0)


def test_the_job_stops_itself_at_its_deadline_with_a_checkpoint_and_says_why(text_dataset, tmp_path, capsys,
                                                                           monkeypatch):
    output_data = tmp_path / "output" / "data"
    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(output_data))  # where SageMaker reads the failure file from
    monkeypatch.setenv(train.JOB_NAME_ENVIRONMENT, JOB)
    ticking(monkeypatch)
    deadline = 40
    status, output = helpers.run_in_process(capsys, text_dataset, str(tmp_path), max_steps=60,
                                            stop_after_seconds=deadline)
    assert status == train.EXIT_DEADLINE, output
    # one reading a step: the deadline falls where the next step and a save would no longer fit before it
    # (a save of the tiny model's state: lm.spec.job.save_seconds, 31 s; each step here takes milliseconds)
    stopped = max(helpers.losses(output))
    assert stopped == deadline - job.save_seconds(1) + 1  # the reading at step k is k - 1
    reason = (output_data.parent / "failure").read_text()
    assert reason.startswith("stopped at step %d of 60 at stop_after_seconds %d" % (stopped, deadline)), reason
    assert "the checkpoint of step %d is saved" % stopped in reason
    saved = checkpoint_files(tmp_path / "ckpt")
    assert saved == ["ckpt-%08d.npz" % stopped]
    meta = checkpoint.read_meta(str(tmp_path / "ckpt" / saved[0]))
    assert meta["job"]["name"] == JOB and meta["job"]["seconds"] >= stopped - 1
    assert not (tmp_path / "model" / "model.json").exists()  # no export: the run did not finish

    # a restart of the same job (a spot interruption): its seconds carry on, past the deadline at once
    (output_data.parent / "failure").unlink()
    ticking(monkeypatch)
    status, output = helpers.run_in_process(capsys, text_dataset, str(tmp_path), max_steps=60,
                                            stop_after_seconds=deadline)
    assert status == train.EXIT_DEADLINE, output
    assert "resumed from" in output and max(helpers.losses(output)) == stopped + 1

    # another job resuming these checkpoints (resume_from) has its own clock: it trains to the end
    monkeypatch.setenv(train.JOB_NAME_ENVIRONMENT, JOB.replace("-1", "-2"))
    (output_data.parent / "failure").unlink()
    ticking(monkeypatch)
    status, output = helpers.run_in_process(capsys, text_dataset, str(tmp_path), max_steps=60,
                                            stop_after_seconds=deadline + 60)
    assert status == 0, output
    assert min(helpers.losses(output)) == stopped + 2 and (tmp_path / "model" / "model.json").exists()
    assert not (output_data.parent / "failure").exists()
