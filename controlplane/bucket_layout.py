"""The artifact bucket's layout: the key prefixes a job writes under and reads from.

The CreateTrainingJob request (`controlplane.request`: OutputDataConfig, CheckpointConfig,
TensorBoardOutputConfig), the execution and endpoint roles' S3 grants (`stacks.iam`), the bucket's
lifecycle (`stacks.storage`), the state machine's checks of init_from and deploy.model_artifact
(`stacks.state_machine.training`, `controlplane.gate`) and `lmstack.start --upload-corpus` all read these,
so a prefix changed here changes every one of them. The image never sees a key: SageMaker copies its
channels in and its model and checkpoints out (`lm.spec.contract` holds the container's side).

Pure Python, no TensorFlow.
"""

# Written by jobs; the execution role may touch only these.
OUTPUT_PREFIX = "output/"            # OutputDataConfig: <job>/output/model.tar.gz
CHECKPOINT_PREFIX = "checkpoints/"   # CheckpointConfig: <execution name>/ (kept across attempts)
TENSORBOARD_PREFIX = "tensorboard/"  # TensorBoardOutputConfig: <job>/ event files
# The evaluation job's OutputDataConfig: <execution name>/<job>/output/output.tar.gz holds its results JSON.
EVALUATION_PREFIX = "evaluation/"
ARTIFACT_PREFIXES = (OUTPUT_PREFIX, CHECKPOINT_PREFIX, TENSORBOARD_PREFIX, EVALUATION_PREFIX)
# The model.tar.gz of every job (OutputDataConfig <OUTPUT_PREFIX><job>/output/): all an endpoint may read.
MODEL_ARTIFACT_KEYS = OUTPUT_PREFIX + "*/output/model.tar.gz"
# Raw corpora uploaded by `python -m lmstack.start --upload-corpus`; jobs may only read them.
RAW_PREFIX = "raw/"
# Hugging Face directories a training run may start from (execution input init_from, the channel
# lm.spec.contract.INIT_CHANNEL) and a deploy-only run may serve on TGI or LMI (deploy.model_artifact);
# jobs and endpoints may only read them.
INIT_PREFIX = "models/"
# The evaluation tasks' data (execution input evaluate.data_s3_uri: task YAMLs, their JSON files, a Hugging Face
# datasets cache), staged by hand since the jobs' VPC has no internet; jobs may only read it.
TASK_DATA_PREFIX = "tasks/"
READ_ONLY_PREFIXES = (RAW_PREFIX, INIT_PREFIX, TASK_DATA_PREFIX)
