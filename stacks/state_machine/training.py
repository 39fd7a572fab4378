"""The main (Standard) state machine: validate -> [prepare] -> train -> [deploy] -> outputs.

Extension points: a stage is a dict of states entered at one name and leaving to the next;
`build_training_definition` chains them, so a new stage is one more entry in that chain.

The prepare stage runs when `prepare.enabled`. It is skipped when a prepare job of an
earlier execution completed for the same dataset key: the MD5 of data_directory, tokenizer,
train_tokenizer, vocab_size and seq_len (and init_from, whose tokenizer the prepare job then
uses), kept as the job's tag `lmstack:dataset-key` and found with SageMaker Search. (The
machine cannot look into EFS itself; `prepare.force` runs it regardless, e.g. after the
directory was emptied.)
"""
import collections

from lm import contract, request, rules
from stacks.state_machine import asl, deploy, inputs, jobs

VALIDATE = "Validate"
RUN = "Run"
INIT_FROM = "InitFrom"
PREPARE = "Prepare"
DEPLOY = "Deploy"
OUTPUTS = "Outputs"

EXAMPLE_INPUT = {
    "preset": "gpt-125m",
    "strategy": "horovod",
    "instance_type": "ml.p3.16xlarge",
    "instance_count": 2,
    "max_runtime_seconds": 86400,
    "hyperparameters": {"global_batch_size": 256, "max_steps": 20000},
    "deploy": {"enabled": True, "endpoint_name": "gpt-125m"},
    "min_quality": 3.5,
}

DATASET_NOT_PREPARED = "DatasetNotPrepared"
DATASET_KEY_FIELDS = ("$.config.data_directory", "$.config.prepare.hyperparameters.tokenizer",
                      "$.config.prepare.hyperparameters.train_tokenizer",
                      "$.config.prepare.hyperparameters.vocab_size", "$.config.prepare.hyperparameters.seq_len")
# With init_from the dataset is tokenized with the checkpoint's tokenizer, so its prefix is part of the
# key (only then: the keys of datasets prepared without it stay what they were).
INIT_DATASET_KEY_FIELDS = DATASET_KEY_FIELDS + (jobs.INIT_FROM_PATH,)
# What a tag value may hold (CreateTrainingJob API reference, Tag.Value: ^([\p{L}\p{Z}\p{N}_.:/=+\-@]*)$),
# ASCII letters and digits for \p{L} and \p{N}: init_from becomes the tag lmstack:init-from of its jobs.
TAG_VALUE_CHARACTERS = rules.ALPHANUMERIC + " _.:/=+-@"


def dataset_key(fields):
    """The expression of the dataset key: the MD5 of the values at `fields`, joined by |."""
    return "States.Hash(%s, 'MD5')" % asl.fmt("|".join(["{}"] * len(fields)), *fields)


def _run_state(next_state, key_fields=DATASET_KEY_FIELDS):
    """$.run: the execution's id (in job names), the dataset key, the defaults of optional fields."""
    return asl.pass_state(next_state, {
        "id.$": "States.Hash($$.Execution.Id, 'MD5')",
        "dataset_key.$": dataset_key(key_fields),
        "defaults": jobs.DESCRIBE_DEFAULTS,
    }, result_path="$.run")


def _dataset_check_states(first, next_state):
    """Without a prepare stage, the dataset must have been made by a completed prepare job (tag
    lmstack:dataset-directory = data_directory): SageMaker fails a job whose EFS directory does not
    exist only after its instances were provisioned, so this is checked before any job starts. Only
    prepare jobs carry the tag. (One Tags.* filter: moto's Search ignores the filters after the first.)"""
    states = collections.OrderedDict()
    states[first] = asl.task(asl.sdk("sagemaker", "search"), {
        "Resource": "TrainingJob",
        "SearchExpression": {"Filters": [
            {"Name": "TrainingJobStatus", "Operator": "Equals", "Value": "Completed"},
            {"Name": "Tags.%s" % request.DATASET_DIRECTORY_TAG, "Operator": "Equals",
             "Value.$": "$.config.data_directory"},
        ]},
        "MaxResults": 1,
    }, first + ".Found", result_path="$.scratch", retry=jobs.RETRY)
    # Search's Results is optional in its response: no match may come back without it.
    states[first + ".Found"] = asl.choice([asl.rule(
        {"Variable": "$.scratch.Results[0]", "IsPresent": True}, first + ".Skip")], first + ".NotPrepared")
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
    and so is strategy smp, whose partitioned model lm.train cannot load a checkpoint into.

    The checkpoint brings its tokenizer: a prepare stage tokenizes with it (lm.prepare reads the
    init channel), so a tokenizer of prepare's own (`tokenizer`, `train_tokenizer`) is refused, and
    the dataset key includes init_from. Characters a tag value cannot hold are refused too
    (`States.StringSplit` at every allowed character leaves nothing exactly when there is no other)."""
    allowed = "s3://${ArtifactBucket}/%s" % contract.INIT_PREFIX
    prepare_enabled = {"Variable": "$.config.prepare.enabled", "BooleanEquals": True}
    prepare_hyperparameters = "$.config.prepare.hyperparameters."
    return collections.OrderedDict([
        (first, asl.choice([
            asl.rule({"Variable": jobs.INIT_FROM_PATH, "IsNull": True}, next_state),
            asl.rule({"Variable": "$.config.strategy", "StringEquals": "smp"}, first + ".Smp"),
            asl.rule({"Variable": jobs.INIT_FROM_PATH, "StringMatches": allowed + "*"}, first + ".Characters"),
        ], first + ".Outside")),
        (first + ".Smp", asl.fail(inputs.ERROR, asl.fmt(
            "init_from is not supported with strategy smp (its model is partitioned across ranks); "
            "choose another strategy"))),
        (first + ".Outside", asl.fail(inputs.ERROR, asl.fmt(
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
        (first + ".Tag", asl.fail(inputs.ERROR, asl.fmt(
            "init_from may hold only letters, digits, spaces and %s (it becomes the tag %s of its jobs), got {}"
            % (" ".join(TAG_VALUE_CHARACTERS[len(rules.ALPHANUMERIC):].strip()), request.INIT_FROM_TAG),
            jobs.INIT_FROM_PATH))),
        (first + ".TrainTokenizer", asl.fail(inputs.ERROR, asl.fmt(
            "init_from brings its tokenizer, which the prepare job tokenizes with: leave "
            "prepare.hyperparameters.train_tokenizer false"))),
        (first + ".Tokenizer", asl.fail(inputs.ERROR, asl.fmt(
            "init_from brings its tokenizer, which the prepare job tokenizes with: leave "
            "prepare.hyperparameters.tokenizer empty, got {}", prepare_hyperparameters + "tokenizer"))),
        (first + ".DatasetKey", _run_state(next_state, INIT_DATASET_KEY_FIELDS)),
    ])


def raw_prefixes(settings):
    """The S3 prefixes prepare.raw_s3_uri may name: what the execution role may read."""
    return ("s3://${ArtifactBucket}/%s" % contract.RAW_PREFIX,) + tuple(settings.raw_data_prefixes)


def _raw_source_states(settings, first, next_state):
    """prepare.raw_s3_uri below a prefix the jobs may read (a job refused S3 access fails only after
    its instances started)."""
    allowed = raw_prefixes(settings)
    return collections.OrderedDict([
        (first, asl.choice([asl.rule(asl.any_of({"Variable": jobs.RAW_S3_URI_PATH, "IsNull": True}, *[
            {"Variable": jobs.RAW_S3_URI_PATH, "StringMatches": prefix + "*"} for prefix in allowed]), next_state)],
            first + ".Outside")),
        (first + ".Outside", asl.fail(inputs.ERROR, asl.fmt(
            "prepare.raw_s3_uri must start with one of %s (the prefixes the jobs may read; add a bucket prefix "
            "with the raw_data_prefixes setting), got {}" % ", ".join(allowed), jobs.RAW_S3_URI_PATH))),
    ])


def _prepare_states(settings, first, next_state):
    states = collections.OrderedDict()
    states[first] = asl.choice([
        asl.rule({"Variable": "$.config.prepare.enabled", "BooleanEquals": False}, first + ".NotEnabled"),
    ], first + ".RawSource")
    states.update(_dataset_check_states(first + ".NotEnabled", next_state))
    states.update(_raw_source_states(settings, first + ".RawSource", first + ".Force"))
    states[first + ".Force"] = asl.choice([
        asl.rule({"Variable": "$.config.prepare.force", "BooleanEquals": True}, jobs.PREPARE.state + ".Start"),
    ], first + ".Search")
    states[first + ".Search"] = asl.task(asl.sdk("sagemaker", "search"), {
        "Resource": "TrainingJob",
        "SearchExpression": {"Filters": [
            {"Name": "TrainingJobStatus", "Operator": "Equals", "Value": "Completed"},
            {"Name": "Tags.%s" % request.DATASET_KEY_TAG, "Operator": "Equals", "Value.$": "$.run.dataset_key"},
        ]},
        "MaxResults": 1,
    }, first + ".Prepared", result_path="$.scratch", retry=jobs.RETRY)
    # Search's Results is optional in its response: no match may come back without it.
    states[first + ".Prepared"] = asl.choice([asl.rule(
        {"Variable": "$.scratch.Results[0]", "IsPresent": True}, first + ".AlreadyDone")],
        jobs.PREPARE.state + ".Start")
    states[first + ".AlreadyDone"] = asl.pass_state(next_state, {"skipped.$": asl.fmt(
        "a prepare job already completed for dataset key {} (set prepare.force to run it again)",
        "$.run.dataset_key")}, result_path="$.prepare_result")
    states.update(jobs.job_states(jobs.PREPARE, settings, first + ".Done"))
    states[first + ".Done"] = asl.pass_state(next_state, {
        "job_name.$": jobs.PREPARE.slot + ".name", "billable_seconds.$": jobs.PREPARE.slot + ".result.billable_seconds",
        "console_url.$": jobs.PREPARE.slot + ".result.console_url", "dataset_key.$": "$.run.dataset_key"},
        result_path="$.prepare_result")
    return states


def _outputs_state():
    train = jobs.TRAIN.slot
    return asl.pass_state(None, collections.OrderedDict([
        ("job_name.$", train + ".name"),
        ("model_artifacts.$", train + ".result.model_artifacts"),
        ("billable_seconds.$", train + ".result.billable_seconds"),
        ("plan_estimate.$", "$.config.plan_estimate"),
        ("training_seconds.$", train + ".result.training_seconds"),
        ("console_url.$", train + ".result.console_url"),
        ("attempts.$", train + ".attempt"),
        ("mlflow_run_id.$", train + ".result.mlflow_run_id"),
        ("final_metrics.$", train + ".metrics"),
        ("prepare.$", "$.prepare_result"),
        ("deploy.$", "$.deploy_result"),
    ]))


def build_training_definition(settings):
    states = collections.OrderedDict()
    states.update(inputs.states(settings, VALIDATE, RUN))
    states[RUN] = _run_state(INIT_FROM)
    states.update(_init_from_states(INIT_FROM, PREPARE))
    states.update(_prepare_states(settings, PREPARE, jobs.TRAIN.state + ".Start"))
    states.update(jobs.job_states(jobs.TRAIN, settings, DEPLOY))
    states.update(deploy.states(settings, DEPLOY, OUTPUTS))
    states[OUTPUTS] = _outputs_state()
    return asl.state_machine(
        "%s: validate the input, [prepare the dataset], train on SageMaker, [deploy an endpoint]"
        % settings.name_prefix, VALIDATE, states)
