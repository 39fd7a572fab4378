"""The main (Standard) state machine: validate -> [prepare] -> train -> [evaluate] -> bill -> [deploy] -> outputs, or
validate -> serve -> deploy -> outputs for a run that only deploys an existing model (deploy.model_artifact).

Validate is one Task: the gate (`controlplane.gate`, a Lambda function, `stacks.gate`) checks the input,
applies its defaults and plans the run; its answer is the state from then on (`$.config`, `$.plan`), or a
refusal the Fail state shows. Nothing in the definition depends on the presets or the instance types.

Extension points: a stage is a dict of states entered at one name and leaving to the next;
`build_training_definition` chains them, so a new stage is one more entry in that chain.

The prepare stage runs when `prepare.enabled`. It looks for the completed prepare job of this
stack's file system (tag `lmstack:file-system`) that made data_directory (tag
`lmstack:dataset-directory`) with SageMaker Search. None: the job runs. One with the same dataset
key (tag `lmstack:dataset-key`: the MD5 of data_directory, the raw source, every prepare setting
that decides the shards, `PREPARE_OUTPUT_HYPERPARAMETERS`, and init_from, whose tokenizer
the prepare job then uses): the job is skipped, or run again with `prepare.force` (the machine
cannot look into EFS itself, e.g. after the directory was emptied). One with another key: the
directory holds another dataset, which lm.data.prepare would mix with this one, so the run is refused
before any job, naming both sources (tag `lmstack:raw-source`).

Every job's end (completed, failed or stopped) is recorded for the bill (`stacks.state_machine.bill`): a run
that completes its training gets its bill before Deploy, a failed one before its Fail state.

A deploy-only run (`deploy.model_artifact`, which the gate checked) goes from the gate to the Serve stage:
the artifact must be in this stack's artifact bucket (a training job's model.tar.gz under output/, or a
Hugging Face directory under models/, what the endpoint role may read), and it becomes the model the Deploy
stage serves (`$.train.result.model_artifacts`, where a training run leaves its job's); no prepare or
training job is made.

`resume_from` (the name of an earlier execution's checkpoint prefix) makes the training job's
CheckpointConfig point at that prefix: SageMaker copies it to /opt/ml/checkpoints when the job
starts, lm.training.train resumes from the newest checkpoint there (refusing one of another model or
dataset) and the new checkpoints go on under the same prefix, which a failed run's cause names.
"""
import collections
import hashlib
import json

from controlplane import bucket_layout
from controlplane import rules
from lm.spec.conditions import INVALID
from controlplane import request
from stacks.state_machine import asl, bill, deploy, evaluate, jobs
from stacks.state_machine.jobs import GATE_FAILED, gate_task

VALIDATE = "Validate"
SERVE = "Serve"
RUN = "Run"
INIT_FROM = "InitFrom"
RESUME = "Resume"
PREPARE = "Prepare"
EVALUATE = "Evaluate"
TASK_DATA = "TaskData"
BILL = "Bill"
DEPLOY = "Deploy"
OUTPUTS = "Outputs"

EXAMPLE_INPUT = {
    "preset": "gpt-125m",
    "strategy": "horovod",
    "instance_type": "ml.p3.16xlarge",
    "instance_count": 2,
    "max_runtime_seconds": 86400,
    "hyperparameters": {"global_batch_size": 128, "max_steps": 20000, "recompute": True},
    "deploy": {"enabled": True, "endpoint_name": "gpt-125m"},
    "min_quality": 3.5,
}

DATASET_NOT_PREPARED = "DatasetNotPrepared"
OTHER_DATASET = "DirectoryHoldsAnotherDataset"
RESUME_FROM_PATH = "$.config.resume_from"
RAW_SOURCE_PATH = "$.run.raw.source"  # prepare.raw_s3_uri, else prepare.raw_directory
# The prepare settings (lm.spec.job.PREPARE_HYPERPARAMETERS) that decide the bytes of the dataset (the tokenizer
# and how the token stream is cut and split); the others decide only how fast it is made.
PREPARE_OUTPUT_HYPERPARAMETERS = ("tokenizer", "train_tokenizer", "vocab_size", "tokenizer_sample_bytes",
                                  "eod_token", "seq_len", "shard_size", "val_fraction")
DATASET_KEY_FIELDS = ("$.config.data_directory", RAW_SOURCE_PATH) + tuple(
    "$.config.prepare.hyperparameters.%s" % name for name in PREPARE_OUTPUT_HYPERPARAMETERS)
# With init_from the dataset is tokenized with the checkpoint's tokenizer, so its prefix is part of the key.
INIT_DATASET_KEY_FIELDS = DATASET_KEY_FIELDS + (jobs.INIT_FROM_PATH,)
# What a tag value may hold (CreateTrainingJob API reference, Tag.Value: ^([\p{L}\p{Z}\p{N}_.:/=+\-@]*)$),
# ASCII letters and digits for \p{L} and \p{N}: init_from becomes the tag lmstack:init-from of its jobs.
TAG_VALUE_CHARACTERS = rules.ALPHANUMERIC + " _.:/=+-@"


def dataset_key(fields):
    """The expression of the dataset key: the MD5 of the values at `fields`, joined by |."""
    return "States.Hash(%s, 'MD5')" % asl.fmt("|".join(["{}"] * len(fields)), *fields)


def concrete_dataset_key(config):
    """The dataset key an execution with `config` (the input with its defaults) computes: what its
    prepare job is tagged with. States.Format writes a string as it is, other values as JSON."""
    prepare = config["prepare"]
    state = {"config": config, "run": {"raw": {
        "source": prepare["raw_directory"] if prepare["raw_s3_uri"] is None else prepare["raw_s3_uri"]}}}
    fields = DATASET_KEY_FIELDS if config["init_from"] is None else INIT_DATASET_KEY_FIELDS
    text = "|".join(value if isinstance(value, str) else json.dumps(value)
                    for value in map(request.values_at(state), fields))
    return hashlib.md5(text.encode()).hexdigest()


def _dataset_key_state(next_state, key_fields):
    return asl.pass_state(next_state, {"key.$": dataset_key(key_fields)}, result_path="$.run.dataset")


def _validate_states(first, next_state):
    """The gate (`controlplane.gate`, a Lambda function): the input checked, its defaults applied, the run
    planned as asked. Its answer replaces the state: `$.config` (the input with its defaults), `$.plan` (what
    the planner planned for it, `controlplane.gate.plan_summary`), `$.launches` (how many instance types the
    run may fall back through) and `$.notes` (published). A refusal ends the execution with the gate's error
    and cause."""
    return collections.OrderedDict([
        (first, gate_task({"input.$": "$", "execution_name.$": "$$.Execution.Name", "launch": 0},
                          first + ".Decided", "$", first + ".GateFailed")),
        (first + ".Decided", asl.choice([asl.rule({"Variable": "$.answer.ok", "BooleanEquals": False},
                                                  first + ".Refused")], first + ".Accepted")),
        (first + ".Refused", {"Type": "Fail", "ErrorPath": "$.answer.error", "CausePath": "$.answer.cause"}),
        (first + ".Accepted", asl.pass_state(first + ".Noted", {
            "config.$": "$.answer.config", "plan.$": "$.answer.plan", "launches.$": "$.answer.launches",
            "notes.$": "$.answer.notes"})),
        # What the gate has to say about an accepted run (the planner's warnings; a check's notes) goes to the topic.
        (first + ".Noted", asl.choice([asl.rule({"Variable": "$.notes[0]", "IsPresent": True}, first + ".Notes")],
                                      first + ".Route")),
        (first + ".Notes", asl.publish("${TopicArn}", asl.fmt("execution {}: {}", "$$.Execution.Name",
                                                             asl.to_json("$.notes")), first + ".Route")),
        # a run that only deploys (deploy.model_artifact) trains nothing
        (first + ".Route", asl.choice([asl.rule({"Variable": MODEL_ARTIFACT_PATH, "IsNull": False}, SERVE)],
                                      next_state)),
        (first + ".GateFailed", asl.fail(GATE_FAILED, "$.gate_error.Cause")),
    ])


MODEL_ARTIFACT_PATH = "$.config.deploy.model_artifact"


def _serve_states(first, next_state):
    """deploy.model_artifact in this stack's artifact bucket (what the endpoint role may read: a training job's
    model.tar.gz, or a Hugging Face directory under models/) becomes the model the Deploy stage serves."""
    archive = "s3://${ArtifactBucket}/%s*/output/model.tar.gz" % bucket_layout.OUTPUT_PREFIX
    directory = "s3://${ArtifactBucket}/%s*/" % bucket_layout.INIT_PREFIX
    return collections.OrderedDict([
        (first, asl.choice([asl.rule(asl.any_of({"Variable": MODEL_ARTIFACT_PATH, "StringMatches": archive},
                                                {"Variable": MODEL_ARTIFACT_PATH, "StringMatches": directory}),
                                     first + ".Run")], first + ".Outside")),
        (first + ".Outside", asl.fail(INVALID, asl.fmt(
            "deploy.model_artifact must be in the artifact bucket of this stack, %s or %s, got {}" % (archive, directory),
            MODEL_ARTIFACT_PATH))),
        (first + ".Run", asl.pass_state(first + ".Model", {
            "id.$": "States.Hash($$.Execution.Id, 'MD5')", "defaults": jobs.DESCRIBE_DEFAULTS}, result_path="$.run")),
        (first + ".Model", asl.pass_state(next_state, {"result": {"model_artifacts.$": MODEL_ARTIFACT_PATH}},
                                          result_path=jobs.TRAIN.slot)),
    ])


def _run_states(first, next_state):
    """$.run: the execution's id (in job names), the defaults of optional fields, the raw source
    (`raw.source`), the checkpoint prefix's name (`checkpoints.name`) and the dataset key (`dataset.key`)."""
    states = collections.OrderedDict()
    states[first] = asl.pass_state(first + ".RawSource", {
        "id.$": "States.Hash($$.Execution.Id, 'MD5')",
        "defaults": jobs.DESCRIBE_DEFAULTS,
        "usage": {},  # what each job that ran used: the bill (stacks.state_machine.bill)
    }, result_path="$.run")
    states[first + ".RawSource"] = asl.choice([asl.rule({"Variable": jobs.RAW_S3_URI_PATH, "IsNull": False},
                                                        first + ".RawSource.S3")], first + ".RawSource.EFS")
    for name, path in (("S3", jobs.RAW_S3_URI_PATH), ("EFS", "$.config.prepare.raw_directory")):
        states[first + ".RawSource." + name] = asl.pass_state(first + ".Checkpoints", {"source.$": path},
                                                              result_path="$.run.raw")
    states[first + ".Checkpoints"] = asl.choice([asl.rule({"Variable": RESUME_FROM_PATH, "IsNull": False},
                                                          first + ".Checkpoints.Resume")], first + ".Checkpoints.Own")
    for name, path in (("Resume", RESUME_FROM_PATH), ("Own", "$$.Execution.Name")):
        states[first + ".Checkpoints." + name] = asl.pass_state(first + ".DatasetKey", {"name.$": path},
                                                                result_path="$.run.checkpoints")
    states[first + ".DatasetKey"] = _dataset_key_state(next_state, DATASET_KEY_FIELDS)
    return states


def _search(filters, next_state):
    """SageMaker Search for one training job of this stack's file system matching `filters` into $.scratch."""
    return asl.task(asl.sdk("sagemaker", "search"), {
        "Resource": "TrainingJob",
        "SearchExpression": {"Filters": filters + [
            {"Name": "Tags.%s" % request.FILE_SYSTEM_TAG, "Operator": "Equals", "Value": "${FileSystemId}"}]},
        "MaxResults": 1,
    }, next_state, result_path="$.scratch", retry=jobs.RETRY)


def _found(found, not_found):
    """Search's Results is optional in its response: no match may come back without it."""
    return asl.choice([asl.rule({"Variable": "$.scratch.Results[0]", "IsPresent": True}, found)], not_found)


COMPLETED = {"Name": "TrainingJobStatus", "Operator": "Equals", "Value": "Completed"}


def _prepared_here():
    return {"Name": "Tags.%s" % request.DATASET_DIRECTORY_TAG, "Operator": "Equals", "Value.$": "$.config.data_directory"}


def _dataset_check_states(first, next_state):
    """Without a prepare stage, the dataset must have been made by a completed prepare job (tag
    lmstack:dataset-directory = data_directory): SageMaker fails a job whose EFS directory does not
    exist only after its instances were provisioned, so this is checked before any job starts. Only
    prepare jobs carry the tag; only this stack's file system counts."""
    states = collections.OrderedDict()
    states[first] = _search([COMPLETED, _prepared_here()], first + ".Found")
    states[first + ".Found"] = _found(first + ".Skip", first + ".NotPrepared")
    states[first + ".Skip"] = asl.pass_state(next_state, result={"skipped": "prepare.enabled is false"},
                                             result_path="$.prepare_result")
    states[first + ".NotPrepared"] = asl.fail(DATASET_NOT_PREPARED, asl.fmt(
        "data_directory {} was never prepared: no completed prepare job made it. Prepare it in this run: set "
        "prepare.enabled to true with prepare.raw_s3_uri (an S3 prefix of Pile-format files; "
        "python -m lmstack.start --upload-corpus DIR uploads a local corpus) or prepare.raw_directory (on EFS)",
        "$.config.data_directory"))
    return states


def _init_from_states(first, next_state):
    """init_from is read by the job role, which may read only the artifact bucket's INIT_PREFIX:
    another prefix is refused here, before any job starts (the bucket name is filled in at deploy),
    and so is strategy smp, whose partitioned model lm.training.train cannot load a checkpoint into.

    The checkpoint brings its tokenizer: a prepare stage tokenizes with it (lm.data.prepare reads the
    init channel), so a tokenizer of prepare's own (`tokenizer`, `train_tokenizer`) is refused, and
    the dataset key includes init_from. Characters a tag value cannot hold are refused too
    (`States.StringSplit` at every allowed character leaves nothing exactly when there is no other)."""
    allowed = "s3://${ArtifactBucket}/%s" % bucket_layout.INIT_PREFIX
    prepare_enabled = {"Variable": "$.config.prepare.enabled", "BooleanEquals": True}
    prepare_hyperparameters = "$.config.prepare.hyperparameters."
    return collections.OrderedDict([
        (first, asl.choice([
            asl.rule({"Variable": jobs.INIT_FROM_PATH, "IsNull": True}, next_state),
            asl.rule({"Variable": "$.config.strategy", "StringEquals": "smp"}, first + ".Smp"),
            asl.rule({"Variable": jobs.INIT_FROM_PATH, "StringMatches": allowed + "*"}, first + ".Characters"),
        ], first + ".Outside")),
        (first + ".Smp", asl.fail(INVALID, asl.fmt(
            "init_from is not supported with strategy smp (its model is partitioned across ranks); "
            "choose another strategy"))),
        (first + ".Outside", asl.fail(INVALID, asl.fmt(
            "init_from must start with %s (the prefix the training jobs may read), got {}" % allowed,
            jobs.INIT_FROM_PATH))),
        (first + ".Characters", asl.pass_state(first + ".Check", {
            "others.$": "States.ArrayLength(States.StringSplit(%s, %s))" % (
                jobs.INIT_FROM_PATH, asl.quote(TAG_VALUE_CHARACTERS))}, result_path="$.scratch")),
        (first + ".Check", asl.choice([
            asl.rule({"Variable": "$.scratch.others", "NumericGreaterThan": 0}, first + ".Tag"),
            asl.rule(asl.all_of(prepare_enabled, {"Variable": prepare_hyperparameters + "train_tokenizer",
                                                  "BooleanEquals": True}), first + ".TrainTokenizer"),
            asl.rule(asl.all_of(prepare_enabled, asl.negate({"Variable": prepare_hyperparameters + "tokenizer",
                                                             "StringEquals": ""})), first + ".Tokenizer"),
        ], first + ".DatasetKey")),
        (first + ".Tag", asl.fail(INVALID, asl.fmt(
            "init_from may hold only letters, digits, spaces and %s (it becomes the tag %s of its jobs), got {}"
            % (" ".join(TAG_VALUE_CHARACTERS[len(rules.ALPHANUMERIC):].strip()), request.INIT_FROM_TAG),
            jobs.INIT_FROM_PATH))),
        (first + ".TrainTokenizer", asl.fail(INVALID, asl.fmt(
            "init_from brings its tokenizer, which the prepare job tokenizes with: leave "
            "prepare.hyperparameters.train_tokenizer false"))),
        (first + ".Tokenizer", asl.fail(INVALID, asl.fmt(
            "init_from brings its tokenizer, which the prepare job tokenizes with: leave "
            "prepare.hyperparameters.tokenizer empty, got {}", prepare_hyperparameters + "tokenizer"))),
        (first + ".DatasetKey", _dataset_key_state(next_state, INIT_DATASET_KEY_FIELDS)),
    ])


def _resume_states(first, next_state):
    """resume_from must name a checkpoint prefix a training job of this stack wrote (tag lmstack:checkpoints
    on this file system's jobs), and no job may be writing to it now. Whether its checkpoints fit this
    run's model and dataset only lm.training.train can tell: it refuses them, naming both."""
    checkpoints = {"Name": "Tags.%s" % request.CHECKPOINTS_TAG, "Operator": "Equals", "Value.$": RESUME_FROM_PATH}
    prefix = "s3://${ArtifactBucket}/%s{}/" % bucket_layout.CHECKPOINT_PREFIX
    return collections.OrderedDict([
        (first, asl.choice([asl.rule({"Variable": RESUME_FROM_PATH, "IsNull": True}, next_state),
                            # Search refuses an empty filter value (Filter.Value: .+)
                            asl.rule({"Variable": RESUME_FROM_PATH, "StringEquals": ""}, first + ".Unknown")],
                           first + ".Search")),
        (first + ".Search", _search([checkpoints], first + ".Found")),
        (first + ".Found", _found(first + ".Busy", first + ".Unknown")),
        (first + ".Unknown", asl.fail(INVALID, asl.fmt(
            "resume_from must name the checkpoint prefix of an earlier execution of this stack (the cause of a failed "
            "run names it); no training job of this stack wrote to %s, got {}" % prefix,
            RESUME_FROM_PATH, RESUME_FROM_PATH))),
        (first + ".Busy", _search([{"Name": "TrainingJobStatus", "Operator": "Equals", "Value": "InProgress"},
                                   checkpoints], first + ".Idle")),
        (first + ".Idle", _found(first + ".InUse", next_state)),
        (first + ".InUse", asl.fail(INVALID, asl.fmt(
            "resume_from {}: a training job is writing to %s now; wait until it ends or stop its execution"
            % prefix, RESUME_FROM_PATH, RESUME_FROM_PATH))),
    ])


def raw_prefixes(settings):
    """The S3 prefixes prepare.raw_s3_uri may name: what the execution role may read."""
    return ("s3://${ArtifactBucket}/%s" % bucket_layout.RAW_PREFIX,) + tuple(settings.raw_data_prefixes)


def _raw_source_states(settings, first, next_state):
    """prepare.raw_s3_uri below a prefix the jobs may read (a job refused S3 access fails only after
    its instances started)."""
    allowed = raw_prefixes(settings)
    return collections.OrderedDict([
        (first, asl.choice([asl.rule(asl.any_of({"Variable": jobs.RAW_S3_URI_PATH, "IsNull": True}, *[
            {"Variable": jobs.RAW_S3_URI_PATH, "StringMatches": prefix + "*"} for prefix in allowed]), next_state)],
            first + ".Outside")),
        (first + ".Outside", asl.fail(INVALID, asl.fmt(
            "prepare.raw_s3_uri must start with one of %s (the prefixes the jobs may read; add a bucket prefix "
            "with the raw_data_prefixes setting), got {}" % ", ".join(allowed), jobs.RAW_S3_URI_PATH))),
    ])


def _tag_values(key):
    """The values of tag `key` of the job Search found (a list: one value, or none on a job made before it)."""
    return "$.scratch.Results[0].TrainingJob.Tags[?(@.Key == '%s')].Value" % key


def _existing_dataset_states(first, same, fresh):
    """The completed prepare job of this file system that made data_directory: none -> `fresh`; with this
    run's dataset key -> `same`; with another key
    the directory holds another dataset: refused, naming both sources."""
    states = collections.OrderedDict()
    states[first] = _search([COMPLETED, _prepared_here()], first + ".Found")
    states[first + ".Found"] = _found(first + ".Tags", fresh)
    states[first + ".Tags"] = asl.pass_state(first + ".Same", {
        "job.$": "$.scratch.Results[0].TrainingJob.TrainingJobName",
        "key.$": _tag_values(request.DATASET_KEY_TAG), "source.$": _tag_values(request.RAW_SOURCE_TAG)},
        result_path="$.scratch")
    states[first + ".Same"] = asl.choice([
        asl.rule(asl.all_of({"Variable": "$.scratch.key[0]", "IsPresent": True},
                            {"Variable": "$.scratch.key[0]", "StringEqualsPath": jobs.DATASET_KEY_PATH}), same),
        asl.rule({"Variable": "$.scratch.source[0]", "IsPresent": True}, first + ".OtherSource")],
        first + ".OtherDataset")
    other = ("data_directory {} on the file system of this stack holds the dataset prepare job {} made from %s; this run "
             "would prepare {} into it (dataset key {}, another source or other prepare settings), mixing the two. "
             "Choose another data_directory (python -m lmstack.start --upload-corpus gives each corpus its own)")
    arguments = ["$.config.data_directory", "$.scratch.job", RAW_SOURCE_PATH, jobs.DATASET_KEY_PATH]
    states[first + ".OtherSource"] = asl.fail(OTHER_DATASET, asl.fmt(
        other % "{}", *(arguments[:2] + ["$.scratch.source[0]"] + arguments[2:])))
    states[first + ".OtherDataset"] = asl.fail(OTHER_DATASET, asl.fmt(
        other % "a source it does not record", *arguments))
    return states


def _prepare_states(settings, first, next_state):
    states = collections.OrderedDict()
    states[first] = asl.choice([
        asl.rule({"Variable": "$.config.prepare.enabled", "BooleanEquals": False}, first + ".NotEnabled"),
    ], first + ".RawSource")
    states.update(_dataset_check_states(first + ".NotEnabled", next_state))
    states.update(_raw_source_states(settings, first + ".RawSource", first + ".Search"))
    states.update(_existing_dataset_states(first + ".Search", first + ".Force", jobs.PREPARE.state + ".Start"))
    states[first + ".Force"] = asl.choice([
        asl.rule({"Variable": "$.config.prepare.force", "BooleanEquals": True}, jobs.PREPARE.state + ".Start"),
    ], first + ".AlreadyDone")
    states[first + ".AlreadyDone"] = asl.pass_state(next_state, {"skipped.$": asl.fmt(
        "a prepare job already completed for dataset key {} (set prepare.force to run it again)",
        jobs.DATASET_KEY_PATH)}, result_path="$.prepare_result")
    states.update(jobs.job_states(jobs.PREPARE, settings, first + ".Done"))
    states[first + ".Done"] = asl.pass_state(next_state, {
        "job_name.$": jobs.PREPARE.slot + ".name", "billable_seconds.$": jobs.PREPARE.slot + ".result.billable_seconds",
        "console_url.$": jobs.PREPARE.slot + ".result.console_url", "dataset_key.$": jobs.DATASET_KEY_PATH},
        result_path="$.prepare_result")
    return states


def _outputs_states(first):
    """The execution's output: the training job's, or for a deploy-only run the model it served."""
    train = jobs.TRAIN.slot
    return collections.OrderedDict([
        (first, asl.choice([asl.rule({"Variable": MODEL_ARTIFACT_PATH, "IsNull": False}, first + ".Served")],
                           first + ".Trained")),
        (first + ".Trained", asl.pass_state(None, collections.OrderedDict([
            ("job_name.$", train + ".name"),
            ("model_artifacts.$", train + ".result.model_artifacts"),
            ("billable_seconds.$", train + ".result.billable_seconds"),
            ("plan.$", "$.plan"),
            ("training_seconds.$", train + ".result.training_seconds"),
            ("console_url.$", train + ".result.console_url"),
            ("attempts.$", train + ".attempt"),
            ("mlflow_run_id.$", train + ".result.mlflow_run_id"),
            ("final_metrics.$", train + ".metrics"),
            ("prepare.$", "$.prepare_result"),
            ("evaluation.$", evaluate.RESULT_PATH),
            ("deploy.$", "$.deploy_result"),
            ("bill.$", bill.BILL_PATH),
        ]))),
        (first + ".Served", asl.pass_state(None, collections.OrderedDict([
            ("model_artifacts.$", train + ".result.model_artifacts"), ("plan.$", "$.plan"),
            ("deploy.$", "$.deploy_result")]))),
    ])


def build_training_definition(settings):
    states = collections.OrderedDict()
    states.update(_validate_states(VALIDATE, RUN))
    states.update(_serve_states(SERVE, DEPLOY))
    states.update(_run_states(RUN, INIT_FROM))
    states.update(_init_from_states(INIT_FROM, RESUME))
    states.update(_resume_states(RESUME, TASK_DATA))
    states.update(evaluate.check_states(TASK_DATA, PREPARE))
    states.update(_prepare_states(settings, PREPARE, jobs.TRAIN.state + ".Start"))
    states.update(jobs.job_states(jobs.TRAIN, settings, EVALUATE))
    states.update(evaluate.states(settings, EVALUATE, BILL))
    states.update(bill.states(settings, BILL, DEPLOY, notify=True, retries=(jobs.LAMBDA_RETRY, jobs.RETRY)))
    states.update(deploy.states(settings, DEPLOY, OUTPUTS))
    states.update(_outputs_states(OUTPUTS))
    return {
        "Comment": "%s: validate the input, [prepare the dataset], train on SageMaker, [evaluate], [deploy an endpoint]"
                   % settings.name_prefix,
        "StartAt": VALIDATE,
        "States": states,
    }
