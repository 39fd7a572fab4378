"""The names both sides of a training job must spell the same: the request, the grants, the runtime.

The CreateTrainingJob request (`controlplane.request`), the execution role's S3 grants and the bucket's
lifecycle rules (`stacks.iam`, `stacks.storage`) and the code in the image (`lm.training.train`,
`lm.data.prepare`) all read these. A name changed on one side only would fail a real job with
AccessDenied or an empty channel, so it is written here once.

Pure Python 3.8, no TensorFlow: imported at synth time.
"""

# Input channels. SageMaker mounts channel <name> at /opt/ml/input/data/<name> and the
# toolkit exports SM_CHANNEL_<NAME>.
TRAIN_CHANNEL = "train"      # training: the prepared dataset (EFS, read-only)
RAW_CHANNEL = "raw"          # prepare: the raw Pile files (an S3 prefix, or an EFS directory, read-only)
DATASET_CHANNEL = "dataset"  # prepare: the EFS file system's root (read-write); it makes the dataset directory

# Key prefixes in the artifact bucket; the execution role may touch only these.
OUTPUT_PREFIX = "output/"            # OutputDataConfig: <job>/output/model.tar.gz
CHECKPOINT_PREFIX = "checkpoints/"   # CheckpointConfig: <execution name>/ (kept across attempts)
TENSORBOARD_PREFIX = "tensorboard/"  # TensorBoardOutputConfig: <job>/ event files
ARTIFACT_PREFIXES = (OUTPUT_PREFIX, CHECKPOINT_PREFIX, TENSORBOARD_PREFIX)
# The model.tar.gz of every job (OutputDataConfig <OUTPUT_PREFIX><job>/output/): all an endpoint may read.
MODEL_ARTIFACT_KEYS = OUTPUT_PREFIX + "*/output/model.tar.gz"
# Raw corpora uploaded by `python -m lmstack.start --upload-corpus`; jobs may only read them.
RAW_PREFIX = "raw/"
# Hugging Face directories a training run may start from (execution input init_from, the channel below)
# and a deploy-only run may serve on TGI or LMI (deploy.model_artifact); jobs and endpoints may only read them.
INIT_PREFIX = "models/"
READ_ONLY_PREFIXES = (RAW_PREFIX, INIT_PREFIX)
INIT_CHANNEL = "init"

# EFS: a FileSystemDataSource's DirectoryPath is a path from the file system's root (training
# jobs mount without access points) and must exist when the job starts. The root always does.
FILE_SYSTEM_ROOT = "/"
# Arguments the request adds to a prepare job and lm.data.prepare reads: the dataset directory (a path
# from the root, created inside the dataset channel) and whether the raw channel is sharded per host.
PREPARE_DATASET_DIRECTORY = "dataset_directory"
PREPARE_RAW_SHARDED = "raw_sharded"

# Paths inside the container (the SageMaker training contract).
MODEL_DIR = "/opt/ml/model"
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
# SageMaker uploads this directory to TensorBoardOutputConfig.S3OutputPath while the job runs.
TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"


def channel_environment_variable(channel):
    """The variable the training toolkit sets to a channel's directory."""
    return "SM_CHANNEL_%s" % channel.upper()
