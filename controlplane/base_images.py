"""The training images lmstack builds: each image variant's AWS Deep Learning Container (DLC), and
which variant each strategy, the endpoint and the prepare job run on.

Read by the CDK app (`stacks.images` builds one image per variant, `stacks.settings` checks the
`runtimes` setting), the state machine generator, the rules (`controlplane.rules`: a strategy needs
its variant built) and the planner (the CUDA a variant carries). Nothing in the image reads it: the
image is built FROM the DLC named here (`training_image/Dockerfile`, build argument BASE_IMAGE), so an
edit here changes the build argument, not the build context.
"""
import collections

DLC_ACCOUNT = "763104351884"
DLC_REPOSITORY = "tensorflow-training"

# Image variants (facts page: which TF DLC carries which library). Key -> base image tag.
# tfcurrent: the TF 2.21 training DLC (released 2026-07-10, supported to 2027-07-10; tag from
# the AWS Deep Learning Containers release announcement): Amazon Linux 2023, CUDA 12.9, Keras 3
# only (no tf_keras, no Horovod), so the image adds tf_keras (training_image/Dockerfile).
# tf26 and tf211 are out of DLC support: they are kept only because SMP v1, SMDDP and Horovod
# for TensorFlow exist nowhere newer (docs/limits.md, "Support matrix": each image's support window).
RUNTIMES = collections.OrderedDict([
    ("tf26", "2.6.0-gpu-py38-cu112-ubuntu20.04"),
    ("tf211", "2.11.0-gpu-py39-cu112-ubuntu20.04-sagemaker"),
    ("tfcurrent", "2.21.0-gpu-py312-cu129-amzn2023-sagemaker"),
])
STRATEGY_RUNTIME = {"smp": "tf26", "smddp": "tf211", "horovod": "tf211", "mwms": "tfcurrent", "single": "tfcurrent"}
SERVING_RUNTIME = "tfcurrent"
PREPARE_RUNTIME = "tfcurrent"  # any image variant works: the prepare job needs no GPU and no TensorFlow
# lm-eval (lm.eval) needs Python >= 3.10: only this runtime's image carries it
# (training_image/requirements-eval.txt, locked as requirements/tf<major.minor>-eval.txt).
EVALUATION_RUNTIME = "tfcurrent"


def base_image_uri(runtime, region):
    return "%s.dkr.ecr.%s.amazonaws.com/%s:%s" % (DLC_ACCOUNT, region, DLC_REPOSITORY, RUNTIMES[runtime])
