"""Images: the training image built from `training_image/`, once per enabled runtime (base DLC)."""
import os
from typing import Dict, Sequence

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from constructs import Construct

from controlplane.base_images import base_image_uri

IMAGE_DIRECTORY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training_image")


class TrainingImages(Construct):
    """One `DockerImageAsset` per runtime in `runtimes`; `BASE_IMAGE` picks the DLC of `region`.

    Synth only fingerprints the directory; the images are built and pushed by `cdk deploy`.
    """

    def __init__(self, scope: Construct, construct_id: str, *, runtimes: Sequence[str], region: str) -> None:
        super().__init__(scope, construct_id)
        self.assets: Dict[str, ecr_assets.DockerImageAsset] = {
            runtime: ecr_assets.DockerImageAsset(
                self, "Image_%s" % runtime, directory=IMAGE_DIRECTORY,
                build_args={"BASE_IMAGE": base_image_uri(runtime, region)},
                platform=ecr_assets.Platform.LINUX_AMD64, ignore_mode=IgnoreMode.DOCKER,
                display_name="lmstack training image (%s)" % runtime)
            for runtime in runtimes
        }

    @property
    def image_uris(self) -> Dict[str, str]:
        return {runtime: asset.image_uri for runtime, asset in self.assets.items()}
