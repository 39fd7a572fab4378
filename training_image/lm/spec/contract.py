"""The names both sides of a training job must spell the same: the request and the runtime.

The CreateTrainingJob request (`controlplane.request`) and the code in the image (`lm.training.train`,
`lm.data.prepare`, `lm.serving.server`) both read these: the channels, the arguments the request adds
to a prepare job, and the paths inside the container. A name changed on one side only would fail a
real job with an empty channel or a model the endpoint does not find, so it is written here once.
The artifact bucket's key prefixes, which only the control plane reads, are `controlplane.bucket_layout`.

Pure Python 3.8, no TensorFlow: imported at synth time.
"""

# Input channels. SageMaker mounts channel <name> at /opt/ml/input/data/<name> and the
# toolkit exports SM_CHANNEL_<NAME>.
TRAIN_CHANNEL = "train"      # training: the prepared dataset (EFS, read-only)
RAW_CHANNEL = "raw"          # prepare: the raw Pile files (an S3 prefix, or an EFS directory, read-only)
DATASET_CHANNEL = "dataset"  # prepare: the EFS file system's root (read-write); it makes the dataset directory

# The evaluation job (evaluate.py): the training job's model.tar.gz (an S3 channel of the one object, which it
# extracts) and the tasks' data (evaluate.data_s3_uri); the validation documents come from the dataset on the
# train channel. Its results JSON goes to OUTPUT_DATA_DIR, which SageMaker uploads as output.tar.gz.
MODEL_CHANNEL = "model"
TASKS_CHANNEL = "tasks"
OUTPUT_DATA_DIR = "/opt/ml/output/data"
EVALUATION_RESULTS_FILE = "results.json"
# The MLflow run a job logs to, when not its own (lm.training.tracking): the evaluation job's is the training job's.
MLFLOW_RUN_NAME = "LM_MLFLOW_RUN_NAME"

# init_from: the Hugging Face directory a run starts from (controlplane.bucket_layout.INIT_PREFIX).
INIT_CHANNEL = "init"

# Arguments the request adds to a prepare job and lm.data.prepare reads: the dataset directory (a path
# from the root, created inside the dataset channel) and whether the raw channel is sharded per host.
PREPARE_DATASET_DIRECTORY = "dataset_directory"
PREPARE_RAW_SHARDED = "raw_sharded"

# Paths inside the container (the SageMaker training contract). MODEL_DIR is also where SageMaker
# hosting unpacks the model.tar.gz an endpoint serves (`lm.serving.server`).
MODEL_DIR = "/opt/ml/model"
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
# SageMaker uploads this directory to TensorBoardOutputConfig.S3OutputPath while the job runs.
TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"


def channel_environment_variable(channel):
    """The variable the training toolkit sets to a channel's directory."""
    return "SM_CHANNEL_%s" % channel.upper()
