"""The one stack: wires network, storage, images, IAM, orchestration and monitoring, and does the grants."""
import dataclasses
import json
from typing import Dict

from aws_cdk import Aws, CfnOutput, Fn, Stack
from constructs import Construct

from controlplane import bucket_layout
from stacks import state_machine
from stacks.settings import Settings
from controlplane.gate import Deployment
from stacks.encryption import EncryptionKey
from stacks.gate import Gate
from stacks.iam import Permissions
from stacks.images import TrainingImages
from stacks.monitoring import Monitoring, Notifications
from stacks.network import Network, zones
from stacks.orchestration import Orchestration
from stacks.storage import Storage


class LmStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        zone_names = zones(self, settings) if settings.creates_vpc else None
        if zone_names is not None:
            # The subnet count everything else reads (state machine subnets, mount targets), now known.
            settings = dataclasses.replace(settings, az_count=len(zone_names))
        self.settings = settings
        self.encryption = EncryptionKey(self, "Encryption")
        self.network = Network(self, "Network", settings=settings, zone_names=zone_names, log_key=self.encryption.key)
        self.storage = Storage(self, "Storage", settings=settings, vpc=self.network.vpc,
                               subnets=self.network.subnets,
                               training_security_group=self.network.training_security_group)
        self.images = TrainingImages(self, "Images", runtimes=settings.runtimes, region=settings.region)
        self.notifications = Notifications(self, "Notifications", notification_email=settings.notification_email,
                                           key=self.encryption.key)
        self.permissions = Permissions(
            self, "Permissions", name_prefix=settings.name_prefix, bucket=self.storage.bucket,
            file_system=self.storage.file_system, images=self.images.assets, subnets=self.network.subnets,
            training_security_group=self.network.training_security_group,
            hosting_security_group=self.network.hosting_security_group,
            raw_data_prefixes=settings.raw_data_prefixes, mlflow_resource_arn=settings.mlflow_resource_arn)
        self.gate = Gate(self, "Gate", deployment=Deployment.of(settings),
                         log_retention_days=settings.log_retention_days, log_key=self.encryption.key)
        self.orchestration = Orchestration(
            self, "Orchestration", settings=settings, values=self._substitution_values(),
            training_role=self.permissions.training_machine_role, stop_role=self.permissions.stop_machine_role,
            log_key=self.encryption.key)
        for role in (self.permissions.training_machine_role, self.permissions.stop_machine_role):
            self.encryption.grant_publish(role)
        resources = self.permissions.machine_resources(topic_arn=self.notifications.topic.topic_arn,
                                                       gate_version_arn=self.gate.version.function_arn)
        self.permissions.grant_machine_actions(
            self.permissions.training_machine_role, state_machine.REQUIRED_ACTIONS["training"], resources)
        self.permissions.grant_machine_actions(
            self.permissions.stop_machine_role, state_machine.REQUIRED_ACTIONS["stop"], resources)
        self.monitoring = Monitoring(self, "Monitoring", name_prefix=settings.name_prefix,
                                     state_machine=self.orchestration.training_machine,
                                     stop_machine=self.orchestration.stop_machine, topic=self.notifications.topic)
        self._outputs()

    def _substitution_values(self) -> Dict[str, str]:
        """Every value a definition placeholder can take; each machine gets the ones it names."""
        values = {
            "ExecutionRoleArn": self.permissions.execution_role.role_arn,
            "EndpointRoleArn": self.permissions.endpoint_role.role_arn,
            "ArtifactBucket": self.storage.bucket.bucket_name,
            "FileSystemId": self.storage.file_system.file_system_id,
            "SecurityGroupId": self.network.training_security_group.security_group_id,
            "HostingSecurityGroupId": self.network.hosting_security_group.security_group_id,
            "TopicArn": self.notifications.topic.topic_arn,
            "GateFunctionArn": self.gate.version.function_arn,
        }
        values.update(("Subnet%d" % index, subnet_id) for index, subnet_id in enumerate(self.network.subnet_ids))
        values.update(("Image_%s" % runtime, uri) for runtime, uri in self.images.image_uris.items())
        return values

    def _outputs(self):
        machine = self.orchestration.training_machine
        CfnOutput(self, "StateMachineArn", value=machine.state_machine_arn,
                  description="Start an execution of this state machine to train")
        CfnOutput(self, "StateMachineConsoleUrl", description="The training state machine in the console",
                  value=Fn.join("", ["https://", Aws.REGION, ".console.aws.amazon.com/states/home?region=",
                                     Aws.REGION, "#/statemachines/view/", machine.state_machine_arn]))
        CfnOutput(self, "ArtifactBucketName", value=self.storage.bucket.bucket_name,
                  description="Model artifacts (%s), checkpoints (%s), TensorBoard events (%s), evaluation results (%s)"
                              % bucket_layout.ARTIFACT_PREFIXES)
        CfnOutput(self, "FileSystemId", value=self.storage.file_system.file_system_id,
                  description="EFS holding the datasets under " + self.settings.dataset_directory)
        for runtime, uri in self.images.image_uris.items():
            CfnOutput(self, "ImageUri%s" % runtime, value=uri, description="Training image, runtime " + runtime)
        CfnOutput(self, "ExampleExecutionInput", value=json.dumps(state_machine.EXAMPLE_INPUT, sort_keys=True),
                  description="Paste as the input of a new execution")
