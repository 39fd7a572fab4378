"""The whole CreateTrainingJob request of a job, built in one place.

`create_training_job_request(job)` returns the request for a `TrainingJob`. Each value of a
`TrainingJob` is either a literal or a marker for a value only the running execution knows:

- `Path("$.config.instance_type")`: the value at a JSONPath of the execution's state;
- `Format(template, args)`: a string with `{}` holes filled from markers (built by `text`);
- `JsonText(value)`: the JSON text of a marker's value (built by `json_text`);
- `Sum(left, right)`: the sum of two numbers (built by `add`).

Given only literals, the builder returns the concrete request (tests, tools). Given markers,
it returns the same structure with markers in place; the state machine generator
(`stacks.state_machine.asl.parameters`) turns each marker into a `.$` key and does nothing
else. `values_at(state)` reads markers back against a concrete state, so one mapping from
execution paths to request values serves both.

The hyperparameters are encoded as the SageMaker Python SDK v2 sends them (every value
`json.dumps`-ed, plus the `sagemaker_*` keys of the `TensorFlow` estimator's `distribution`);
tests/test_job_sdk.py compares with the SDK itself.

Pure Python 3.8, no TensorFlow: imported at synth time.
"""
import collections
import dataclasses
import json
from typing import Any, Mapping, Optional, Sequence

from controlplane import bucket_layout
from controlplane import metrics as log_metrics
from lm.spec import contract
from lm.spec import job

VOLUME_SIZE_GB = 100
TAG_PREFIX = "lmstack:"
EXECUTION_TAG = TAG_PREFIX + "execution"
KIND_TAG = TAG_PREFIX + "kind"
DATASET_KEY_TAG = TAG_PREFIX + "dataset-key"
# On prepare jobs: the EFS directory they made. A training run looks for a completed prepare job
# with its data_directory here before it starts (SageMaker Search on this tag).
DATASET_DIRECTORY_TAG = TAG_PREFIX + "dataset-directory"
# On jobs that read init_from (the init channel): its S3 prefix. A prepare job with it tokenized its
# dataset with that checkpoint's tokenizer.
INIT_FROM_TAG = TAG_PREFIX + "init-from"
# On every training job: the stack's EFS file system. The dataset checks search only the jobs of this
# stack's file system, not every job in the account.
FILE_SYSTEM_TAG = TAG_PREFIX + "file-system"
# On prepare jobs: the raw corpus they read (an S3 prefix, or a directory on the file system), named
# when another source is to be prepared into the same directory.
RAW_SOURCE_TAG = TAG_PREFIX + "raw-source"
# On training jobs: the name of the checkpoint prefix below CHECKPOINT_PREFIX they write (their
# execution's name, or the resume_from it continues), which a later execution may resume from.
CHECKPOINTS_TAG = TAG_PREFIX + "checkpoints"
# CreateTrainingJob RetryStrategy (API reference: "The number of times to retry the job when the job
# fails due to an InternalServerError", 1-30): SageMaker restarts the same job, whose checkpoints it
# syncs down again, so an internal error costs the steps since the last checkpoint, not the run.
INTERNAL_ERROR_RETRIES = 2
# The raw corpus from S3 is read by lm.data.prepare once, each file start to end: FastFile streams the
# objects on demand, so the job starts without a copy and the ML volume (VOLUME_SIZE_GB) need not
# hold the corpus, as File mode would need (an instance's share of the Pile is 100 GB and more).
# ShardedByS3Key gives each instance of a multi-instance prepare job its own share of the files.
# (SageMaker API reference: TrainingInputMode, S3DataSource.S3DataDistributionType.)
RAW_S3_INPUT_MODE = "FastFile"
RAW_S3_DISTRIBUTION = "ShardedByS3Key"
CONTAINER_LOG_LEVEL = 20  # logging.INFO, the SDK's default
# sagemaker_program of each kind of job: the image's entry points (training_image/train.py, prepare.py).
JOB_KINDS = {"train": "train.py", "prepare": "prepare.py"}
MPI_STRATEGIES = ("horovod", "smp")
# EFS: a FileSystemDataSource's DirectoryPath is a path from the file system's root (training jobs mount
# without access points) and must exist when the job starts. The root always does: the prepare job's dataset
# channel mounts it, and lm.data.prepare makes the dataset directory inside (contract.PREPARE_DATASET_DIRECTORY).
FILE_SYSTEM_ROOT = "/"
# SMP v1: the MPI options its jobs need, and the mp_parameters an input leaves out (the execution input's
# mp_parameters defaults, controlplane.inputs).
SMP_MPI_OPTIONS = "--mca btl_vader_single_copy_mechanism none"
SMP_DEFAULTS = collections.OrderedDict([
    ("partitions", 2), ("microbatches", 4), ("pipeline", "interleaved"), ("optimize", "speed"), ("horovod", True),
    # The placement lm.distributed.smp makes with smp.partition, which only manual partitioning keeps.
    ("auto_partition", False), ("default_partition", 0),
])
MAX_KEEP_ALIVE_SECONDS = 21600  # ResourceConfig.KeepAlivePeriodInSeconds (SageMaker API reference)


# ---- markers ----

class Path(collections.namedtuple("Path", "path")):
    """The value at `path` (a JSONPath, `$.` for the state, `$$.` for the context object)."""


class Format(collections.namedtuple("Format", "template args")):
    """A string: `template` with each `{}` filled by the matching marker of `args`."""


class JsonText(collections.namedtuple("JsonText", "value")):
    """The JSON text of a marker's value."""


class Sum(collections.namedtuple("Sum", "left right")):
    """The sum of two numbers, at least one of them a marker."""


MARKERS = (Path, Format, JsonText, Sum)


def is_marker(value):
    return isinstance(value, MARKERS)


def text(template, *args):
    """`template` with its `{}` holes filled by `args`: a str when every arg is a literal,
    else a `Format` whose holes are only the markers (literals are written in)."""
    pieces = template.split("{}")
    if len(pieces) != len(args) + 1:
        raise ValueError("template %r has %d holes, got %d values" % (template, len(pieces) - 1, len(args)))
    literal, holes, markers = pieces[0], [], []
    for arg, piece in zip(args, pieces[1:]):
        if is_marker(arg):
            holes.append(literal)
            markers.append(arg)
            literal = piece
        else:
            literal += str(arg) + piece
    if not markers:
        return literal
    return Format("{}".join(holes + [literal]), tuple(markers))


def json_text(value):
    """`json.dumps(value)`, or the marker for it."""
    return JsonText(value) if is_marker(value) else json.dumps(value)


def add(left, right):
    return Sum(left, right) if is_marker(left) or is_marker(right) else left + right


def values_at(state, context=None):
    """A `value_at(path)` function reading `$.a.b` from `state` and `$$.a.b` from `context`."""
    def value_at(path):
        root, _, rest = path.partition(".")
        value = {"$": state, "$$": context or {}}[root]
        for part in rest.split(".") if rest else ():
            value = value[part]
        return value
    return value_at


def resolve(value, value_at):
    """`value` with every marker replaced by what it stands for (see `values_at`)."""
    if isinstance(value, Path):
        return value_at(value.path)
    if isinstance(value, Format):
        return text(value.template, *[resolve(arg, value_at) for arg in value.args])
    if isinstance(value, JsonText):
        return json.dumps(resolve(value.value, value_at))
    if isinstance(value, Sum):
        return resolve(value.left, value_at) + resolve(value.right, value_at)
    if isinstance(value, dict):
        return collections.OrderedDict((key, resolve(item, value_at)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return [resolve(item, value_at) for item in value]
    return value


# ---- the job ----

@dataclasses.dataclass(frozen=True)
class TrainingJob:
    """What a CreateTrainingJob request is made of. `kind` and `strategy` shape the request
    and must be literals; every other value may be a marker."""
    kind: str                       # a key of JOB_KINDS
    name: Any                       # TrainingJobName
    image: Any                      # TrainingImage
    role_arn: Any
    bucket: Any                     # the artifact bucket's name
    region: str
    hyperparameters: Mapping[str, Any]  # lm.training.train's (or lm.data.prepare's) own values, not yet encoded
    instance_type: Any
    instance_count: Any
    max_runtime_seconds: Any
    spot: Any                       # EnableManagedSpotTraining
    file_system_id: Any
    security_group_ids: Sequence[Any]
    subnets: Sequence[Any]
    data_directory: Any             # the dataset directory on EFS
    execution_name: Any             # the execution tag (and the checkpoint prefix, without `checkpoints`)
    strategy: str = "single"
    processes_per_host: Any = 1     # MPI processes per host (horovod, smp)
    mp_parameters: Any = None       # SMP v1 parameters (smp)
    raw_directory: Any = None       # prepare: the raw files on EFS (when raw_s3_uri is None)
    raw_s3_uri: Any = None          # prepare: the raw files under an S3 prefix (an S3 channel)
    dataset_key: Any = None         # prepare: tagged, so a later execution can skip the job
    # An S3 prefix holding a Hugging Face checkpoint directory (or None): training starts from its weights,
    # the prepare job tokenizes with its tokenizer.
    init_from: Any = None
    # The checkpoint prefix's name below CHECKPOINT_PREFIX (training; None: execution_name): an earlier
    # execution's name continues its checkpoints (execution input resume_from).
    checkpoints: Any = None
    traffic_encryption: Any = True  # EnableInterContainerTrafficEncryption (the stack's setting)
    # Capacity options of CreateTrainingJob (SageMaker API reference: InfraCheckConfig, ResourceConfig);
    # None leaves each out of the request.
    infra_check: Any = None         # InfraCheckConfig.EnableInfraCheck: hardware and network checks first
    keep_alive_seconds: Any = None  # ResourceConfig.KeepAlivePeriodInSeconds (0-21600): a warm pool
    training_plan_arn: Any = None   # ResourceConfig.TrainingPlanArn: reserved capacity of a training plan
    mlflow_arn: Any = None          # train: a SageMaker managed MLflow tracking server or app (or None)
    mlflow_experiment: Any = None   # train: its experiment


def artifact_uri(bucket, prefix):
    return text("s3://{}/%s" % prefix, bucket)


def output_path(bucket):
    """OutputDataConfig.S3OutputPath (the SDK's `output_path`, no trailing slash)."""
    return artifact_uri(bucket, bucket_layout.OUTPUT_PREFIX.rstrip("/"))


def distribution_hyperparameters(strategy, instance_type, processes_per_host, model_dir, mp_parameters=None,
                                 custom_mpi_options=None):
    """The keys the SDK v2 `TensorFlow` estimator adds for `distribution` (before JSON encoding).

    Mirrors `Framework._distribution_configuration` and `TensorFlow.hyperparameters` in
    sagemaker-python-sdk v2 (src/sagemaker/estimator.py, src/sagemaker/tensorflow/estimator.py).
    `model_dir` is what the SDK puts there: "/opt/ml/model" under MPI, else
    `<output_path>/<job_name>/model`.
    """
    if strategy not in job.STRATEGIES:
        raise ValueError("strategy must be one of %s, got %r" % (", ".join(job.STRATEGIES), strategy))
    values = collections.OrderedDict()
    if strategy in MPI_STRATEGIES:
        values["sagemaker_mpi_enabled"] = True
        values["sagemaker_mpi_num_of_processes_per_host"] = processes_per_host
        values["sagemaker_mpi_custom_mpi_options"] = (
            custom_mpi_options if custom_mpi_options is not None else (SMP_MPI_OPTIONS if strategy == "smp" else ""))
        if strategy == "smp":
            values["mp_parameters"] = mp_parameters if mp_parameters is not None else collections.OrderedDict(
                SMP_DEFAULTS)
    if strategy in ("smddp", "smp"):
        values["sagemaker_distributed_dataparallel_enabled"] = strategy == "smddp"
        values["sagemaker_instance_type"] = instance_type
        if strategy == "smddp":
            values["sagemaker_distributed_dataparallel_custom_mpi_options"] = custom_mpi_options or ""
    if strategy == "mwms":
        values["sagemaker_multi_worker_mirrored_strategy_enabled"] = True
    values["model_dir"] = contract.MODEL_DIR if strategy in MPI_STRATEGIES else model_dir
    return values


def sdk_hyperparameters(values, *, strategy, instance_type, processes_per_host, job_name, region, output_path,
                        job_kind="train", mp_parameters=None, custom_mpi_options=None):
    """The whole `HyperParameters` map of CreateTrainingJob for lm.training.train's (or lm.data.prepare's) own
    `values`, encoded as the SDK sends it; `output_path` is the job's S3OutputPath.

    `sagemaker_submit_directory` is left out: the code is baked into the image, which sets
    SAGEMAKER_SUBMIT_DIRECTORY itself.
    """
    values = collections.OrderedDict(values)
    values["sagemaker_program"] = JOB_KINDS[job_kind]
    values["sagemaker_container_log_level"] = CONTAINER_LOG_LEVEL
    values["sagemaker_job_name"] = job_name
    values["sagemaker_region"] = region
    if job_kind == "train":
        values.update(distribution_hyperparameters(
            strategy, instance_type, processes_per_host, text("{}/{}/model", output_path, job_name),
            mp_parameters=mp_parameters, custom_mpi_options=custom_mpi_options))
    return encode_hyperparameters(values)


def encode_hyperparameters(values):
    """As the SDK's `EstimatorBase._json_encode_hyperparameters`: each value `json.dumps`-ed (a marker: the
    JSON of what it stands for, at run time)."""
    return collections.OrderedDict((str(key), json_text(value)) for key, value in values.items())


def prepare_arguments(training_job):
    """What the builder itself adds to a prepare job's hyperparameters: where lm.data.prepare writes (the
    data directory, inside the dataset channel, which is the file system's root) and whether the
    raw channel holds only this instance's share of the files."""
    return collections.OrderedDict([(contract.PREPARE_DATASET_DIRECTORY, training_job.data_directory),
                                    (contract.PREPARE_RAW_SHARDED, training_job.raw_s3_uri is not None)])


def hyperparameters(training_job):
    j = training_job
    values = j.hyperparameters
    if j.kind == "prepare":
        values = collections.OrderedDict(values, **prepare_arguments(j))
    return sdk_hyperparameters(values, strategy=j.strategy, instance_type=j.instance_type,
                               processes_per_host=j.processes_per_host, job_name=j.name, region=j.region,
                               output_path=output_path(j.bucket), job_kind=j.kind, mp_parameters=j.mp_parameters)


def stopping_condition(max_runtime_seconds, spot):
    """Spot capacity may take as long as the run itself to come by: MaxWait = 2 x MaxRuntime."""
    if is_marker(spot):
        raise ValueError("spot decides the shape of StoppingCondition: pass it as a literal")
    condition = collections.OrderedDict([("MaxRuntimeInSeconds", max_runtime_seconds)])
    if spot:
        condition["MaxWaitTimeInSeconds"] = add(max_runtime_seconds, max_runtime_seconds)
    return condition


def efs_channel(name, file_system_id, directory_path, access_mode):
    return {
        "ChannelName": name,
        "InputMode": "File",
        "DataSource": {"FileSystemDataSource": collections.OrderedDict([
            ("FileSystemId", file_system_id),
            ("FileSystemAccessMode", access_mode),
            ("FileSystemType", "EFS"),
            ("DirectoryPath", directory_path),
        ])},
    }


def s3_channel(name, s3_uri, input_mode, distribution):
    return {
        "ChannelName": name,
        "InputMode": input_mode,
        "DataSource": {"S3DataSource": collections.OrderedDict([
            ("S3DataType", "S3Prefix"),
            ("S3Uri", s3_uri),
            ("S3DataDistributionType", distribution),
        ])},
    }


def input_channels(training_job):
    """Training reads the prepared dataset directory read-only. The prepare job reads the raw files
    (S3 or EFS) and mounts the file system's root read-write, the one directory that surely exists;
    lm.data.prepare makes the dataset directory inside it. With init_from both get the `init` channel:
    training its weights, the prepare job its tokenizer (every instance: FullyReplicated)."""
    j = training_job
    if j.kind == "train":
        channels = [efs_channel(contract.TRAIN_CHANNEL, j.file_system_id, j.data_directory, "ro")]
    else:
        if j.raw_s3_uri is not None:
            raw = s3_channel(contract.RAW_CHANNEL, j.raw_s3_uri, RAW_S3_INPUT_MODE, RAW_S3_DISTRIBUTION)
        else:
            raw = efs_channel(contract.RAW_CHANNEL, j.file_system_id, j.raw_directory, "ro")
        channels = [raw, efs_channel(contract.DATASET_CHANNEL, j.file_system_id, FILE_SYSTEM_ROOT, "rw")]
    if j.init_from is not None:  # a few files, read once at start-up: copied (File)
        channels.append(s3_channel(contract.INIT_CHANNEL, j.init_from, "File", "FullyReplicated"))
    return channels


def resource_tags(kind, execution_name):
    """The tags of every resource an execution creates (jobs, models, endpoints): the stop
    machine finds an execution's jobs by them."""
    return [{"Key": EXECUTION_TAG, "Value": execution_name}, {"Key": KIND_TAG, "Value": kind}]


def vpc_config(security_group_ids, subnets):
    return {"SecurityGroupIds": list(security_group_ids), "Subnets": list(subnets)}


def checkpoint_prefix_name(training_job):
    """The name below CHECKPOINT_PREFIX the job's checkpoints live under."""
    return training_job.execution_name if training_job.checkpoints is None else training_job.checkpoints


def raw_source(training_job):
    """What a prepare job reads: its S3 prefix, else its directory on the file system."""
    return training_job.raw_directory if training_job.raw_s3_uri is None else training_job.raw_s3_uri


def tags(training_job):
    found = resource_tags(training_job.kind, training_job.execution_name)
    found.append({"Key": FILE_SYSTEM_TAG, "Value": training_job.file_system_id})
    if training_job.kind == "prepare":
        found.append({"Key": DATASET_KEY_TAG, "Value": training_job.dataset_key})
        found.append({"Key": DATASET_DIRECTORY_TAG, "Value": training_job.data_directory})
        found.append({"Key": RAW_SOURCE_TAG, "Value": raw_source(training_job)})
    else:
        found.append({"Key": CHECKPOINTS_TAG, "Value": checkpoint_prefix_name(training_job)})
    if training_job.init_from is not None:
        found.append({"Key": INIT_FROM_TAG, "Value": training_job.init_from})
    return found


def resource_config(training_job):
    """ResourceConfig; the capacity options only when given (SageMaker API reference: ResourceConfig)."""
    j = training_job
    resources = collections.OrderedDict([
        ("InstanceType", j.instance_type), ("InstanceCount", j.instance_count), ("VolumeSizeInGB", VOLUME_SIZE_GB)])
    if j.keep_alive_seconds is not None:
        resources["KeepAlivePeriodInSeconds"] = j.keep_alive_seconds
    if j.training_plan_arn is not None:
        resources["TrainingPlanArn"] = j.training_plan_arn
    return resources


def mlflow_tracking(arn, experiment, run_name):
    """MlflowConfig (the run is named after the job) and the Environment `lm.training.tracking` reads:
    MLflow's own MLFLOW_TRACKING_URI (the ARN, which the sagemaker-mlflow plugin resolves) and
    MLFLOW_EXPERIMENT_NAME."""
    return collections.OrderedDict([
        ("MlflowConfig", collections.OrderedDict([
            ("MlflowResourceArn", arn), ("MlflowExperimentName", experiment), ("MlflowRunName", run_name)])),
        ("Environment", collections.OrderedDict([
            ("MLFLOW_TRACKING_URI", arn), ("MLFLOW_EXPERIMENT_NAME", experiment)])),
    ])


def create_training_job_request(training_job, *, hyperparameter_map: Optional[Any] = None,
                                stopping: Optional[Any] = None, channels: Optional[Any] = None,
                                job_tags: Optional[Any] = None, resources: Optional[Any] = None):
    """The CreateTrainingJob request. `hyperparameter_map`, `stopping`, `channels`, `job_tags` and
    `resources` default to `hyperparameters(job)`, `stopping_condition(...)`, `input_channels(job)`,
    `tags(job)` and `resource_config(job)`; the state machine passes markers for them, since it
    computes them in branches of its own (per strategy, per spot, per raw source, with or without
    init_from, with or without a training plan)."""
    j = training_job
    algorithm = collections.OrderedDict([("TrainingImage", j.image), ("TrainingInputMode", "File")])
    if j.kind == "train":
        algorithm["MetricDefinitions"] = log_metrics.METRIC_DEFINITIONS
        algorithm["EnableSageMakerMetricsTimeSeries"] = True
    request = collections.OrderedDict()
    request["TrainingJobName"] = j.name
    request["AlgorithmSpecification"] = algorithm
    request["RoleArn"] = j.role_arn
    request["HyperParameters"] = hyperparameters(j) if hyperparameter_map is None else hyperparameter_map
    request["InputDataConfig"] = input_channels(j) if channels is None else channels
    request["OutputDataConfig"] = {"S3OutputPath": output_path(j.bucket)}
    request["ResourceConfig"] = resource_config(j) if resources is None else resources
    if j.infra_check is not None:
        request["InfraCheckConfig"] = {"EnableInfraCheck": j.infra_check}
    request["VpcConfig"] = vpc_config(j.security_group_ids, j.subnets)
    request["StoppingCondition"] = stopping_condition(j.max_runtime_seconds, j.spot) if stopping is None else stopping
    if j.kind == "train":
        request["EnableManagedSpotTraining"] = j.spot
        request["CheckpointConfig"] = collections.OrderedDict([
            ("S3Uri", text("s3://{}/%s{}/" % bucket_layout.CHECKPOINT_PREFIX, j.bucket, checkpoint_prefix_name(j))),
            ("LocalPath", contract.CHECKPOINT_LOCAL_PATH)])
        request["TensorBoardOutputConfig"] = collections.OrderedDict([
            ("LocalPath", contract.TENSORBOARD_LOCAL_PATH),
            ("S3OutputPath", text("s3://{}/%s{}" % bucket_layout.TENSORBOARD_PREFIX, j.bucket, j.execution_name))])
        if j.mlflow_arn is not None:
            request.update(mlflow_tracking(j.mlflow_arn, j.mlflow_experiment, j.name))
    request["RetryStrategy"] = {"MaximumRetryAttempts": INTERNAL_ERROR_RETRIES}
    request["EnableInterContainerTrafficEncryption"] = j.traffic_encryption
    # Debugger and Profiler are closed to new accounts (SageMaker developer guide: "Amazon
    # SageMaker Debugger availability change", "Profiler availability change"): off, as the
    # SDK's disable_profiler=True sends it; TensorBoard and CloudWatch replace them.
    request["ProfilerConfig"] = {"DisableProfiler": True}
    request["Tags"] = tags(j) if job_tags is None else job_tags
    return request
