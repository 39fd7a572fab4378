"""Network: the VPC of the jobs and endpoints, its endpoints, flow logs, the training and hosting security groups."""
from aws_cdk import ContextProvider, Fn, Stack, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kms as kms
from constructs import Construct

from stacks.common import log_group
from stacks.settings import ACCOUNTLESS_ZONES, MAX_AZ_COUNT, Settings, SettingsError

# What calls AWS from inside the VPC. SageMaker pulls a job's image and ships its logs and
# metrics on its own side, not through the job's network interfaces ("Give SageMaker AI Training
# Jobs Access to Resources in Your Amazon VPC", SageMaker Developer Guide); what the containers
# themselves reach is S3 (input channels, checkpoints, TensorBoard events, model artifacts:
# SageMaker's transfers through the job's ENIs), through the free S3 gateway endpoint. Neither
# lm.training.train / lm.data.prepare nor lm.serving.server call an AWS API (no boto3 in training_image/lm), so no
# interface endpoint ($0.01 an hour per zone each, about $88 a month for all six in two zones) is
# made by default; each is a setting (interface_endpoints) for code that calls it:
INTERFACE_ENDPOINTS = {
    # A container that pulls images itself (a docker-in-docker step); SageMaker's own pull needs neither.
    "ecr.api": ("EcrApi", ec2.InterfaceVpcEndpointAwsService.ECR),
    "ecr.dkr": ("EcrDocker", ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER),
    # A client that writes its own log streams (watchtower, the CloudWatch agent).
    "logs": ("Logs", ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS),
    # The SageMaker SDK or boto3's sagemaker client in a job.
    "sagemaker.api": ("SageMakerApi", ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_API),
    # lm.training.tracking's MLflow client on a SageMaker managed MLflow server (setting mlflow_resource_arn):
    # the service aws.sagemaker.<region>.experiments ("Connecting to an MLflow tracking server through
    # an Interface VPC Endpoint", SageMaker Developer Guide).
    "sagemaker.experiments": ("SageMakerMlflow", ec2.InterfaceVpcEndpointAwsService("experiments", "aws.sagemaker")),
    # A job that invokes an endpoint (an evaluation step against a deployed model).
    "sagemaker.runtime": ("SageMakerRuntime", ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_RUNTIME),
    # Code that assumes another role (sts:AssumeRole); the job's own credentials come without STS.
    "sts": ("Sts", ec2.InterfaceVpcEndpointAwsService.STS),
}
SUBNET_GROUP = "training"
# Interface endpoints sit in the first zones only: a job in any zone of the VPC reaches them (their
# private DNS names answer with these ENIs), not every endpoint service is offered in every zone
# (a CreateVpcEndpoint in such a zone fails the deploy), and each zone costs an ENI-hour per service.
ENDPOINT_ZONES = 2


# The CDK's context provider for `Stack.availability_zones` (cdk.context.json keys
# `availability-zones:account=<id>:region=<region>`).
AVAILABILITY_ZONE_PROVIDER = "availability-zones"


def zones(stack: Stack, settings: Settings):
    """The zones of the training subnets, one subnet each; the template never selects an index of
    `Fn::GetAZs` an account may not have (it lists only zones with a default subnet, CloudFormation
    `Fn::GetAZs` page):
    - pinned `availability_zones`: those names (the CDK's Vpc checks them against the lookup below);
    - the deploying account known at synth (`CDK_DEFAULT_ACCOUNT`, set by the CDK CLI from the
      credentials): the zones the account has in the region, a context lookup the CLI makes and caches
      in cdk.context.json; all of them (so SageMaker can place a GPU job wherever the type is
      offered, at most MAX_AZ_COUNT) or the first az_count;
    - no account: the first ACCOUNTLESS_ZONES of `Fn::GetAZs`, as the CDK does.
    A SettingsError names az_count when more zones are asked than these give."""
    if settings.availability_zones:
        return list(settings.availability_zones)
    if Token.is_unresolved(stack.account):
        if settings.subnet_count > ACCOUNTLESS_ZONES:
            raise SettingsError(
                "lmstack.az_count: %d zones need the deploying account at synth (cdk run with credentials "
                "sets CDK_DEFAULT_ACCOUNT) or pinned availability_zones; without them the template can only "
                "take the first %d of Fn::GetAZs" % (settings.subnet_count, ACCOUNTLESS_ZONES))
        return [Fn.select(index, Fn.get_azs()) for index in range(settings.subnet_count)]
    found = list(stack.availability_zones)
    count = settings.az_count or min(len(found), MAX_AZ_COUNT)
    looked_up = stack.node.try_get_context(
        ContextProvider.get_key(stack, provider=AVAILABILITY_ZONE_PROVIDER).key) is not None
    if looked_up and count > len(found):
        raise SettingsError("lmstack.az_count: %d, but account %s has %d zones in %s: %s" % (
            count, stack.account, len(found), stack.region, ", ".join(found)))
    # Before the lookup the CDK answers with placeholder zones and records the lookup as missing;
    # the CLI then makes it and synthesizes again, so this first template is never deployed.
    return found[:count]


class Network(Construct):
    """A new VPC (isolated subnets plus endpoints, or NAT by setting) in `zone_names` (`zones`), or an imported one
    (`zone_names` None), and the job and endpoint security groups."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings, zone_names,
                 log_key: kms.IKey) -> None:
        super().__init__(scope, construct_id)
        if settings.creates_vpc:
            self.vpc = self._create_vpc(settings, zone_names, log_key)
            self.subnets = self.vpc.select_subnets(subnet_group_name=SUBNET_GROUP).subnets
        else:
            self.vpc = ec2.Vpc.from_vpc_attributes(
                self, "ImportedVpc", vpc_id=settings.existing_vpc_id, vpc_cidr_block=settings.vpc_cidr,
                # Labels only: nothing in the template names an imported subnet's zone
                # (tests/aws_rules.py get_azs_picks_within_the_first_two holds every template to that).
                availability_zones=[Fn.select(index, Fn.get_azs()) for index in range(settings.az_count)],
                private_subnet_ids=list(settings.existing_subnet_ids))
            self.subnets = self.vpc.private_subnets
        self.training_security_group = ec2.SecurityGroup(
            self, "TrainingSecurityGroup", vpc=self.vpc, allow_all_outbound=True,
            description="lmstack training jobs: all traffic between the hosts of a job (NCCL, MPI, Gloo)")
        self.training_security_group.add_ingress_rule(
            self.training_security_group, ec2.Port.all_traffic(),
            "hosts of one distributed training job talk to each other on any port")
        # EFA's OS-bypass traffic (NCCL over libfabric on the `efa` types of lm.spec.hardware) passes only where
        # the group allows all traffic from and to itself, each way by a rule naming the group: an outbound rule
        # to 0.0.0.0/0 does not count ("Step 1: Prepare an EFA-enabled security group", Amazon EC2 User Guide;
        # EKS's default cluster group keeps an outbound rule to itself "for EFA traffic" beside 0.0.0.0/0, "View
        # Amazon EKS security group requirements for clusters"). The CDK ignores add_egress_rule while
        # allow_all_outbound is on, so the rule is a resource of its own; the 0.0.0.0/0 rule stays for what the
        # jobs reach (S3, EFS, interface endpoints, a NAT gateway, an imported VPC's own services).
        ec2.CfnSecurityGroupEgress(
            self.training_security_group, "EfaToItself", group_id=self.training_security_group.security_group_id,
            ip_protocol="-1", destination_security_group_id=self.training_security_group.security_group_id,
            description="EFA: hosts of one distributed training job send to each other on any protocol")
        # Endpoints: no ingress (SageMaker's front end reaches the container on its own side), and out only
        # HTTPS (the model artifact from S3, through the gateway endpoint): no NFS path to the file system,
        # whose security group admits only the training one.
        self.hosting_security_group = ec2.SecurityGroup(
            self, "HostingSecurityGroup", vpc=self.vpc, allow_all_outbound=False,
            description="lmstack endpoints: HTTPS out only (the model artifact from S3)")
        self.hosting_security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443),
                                                    "S3 (gateway endpoint) and AWS APIs over HTTPS")
        if settings.interface_endpoints:
            self._add_endpoints(settings.interface_endpoints)

    @property
    def subnet_ids(self):
        return [subnet.subnet_id for subnet in self.subnets]

    def _create_vpc(self, settings, zone_names, log_key):
        with_nat = settings.nat_gateways > 0
        # The training subnets share what the public ones leave: room for many job ENIs.
        subnets = [ec2.SubnetConfiguration(
            name=SUBNET_GROUP,
            subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS if with_nat else ec2.SubnetType.PRIVATE_ISOLATED)]
        if with_nat:
            subnets.append(ec2.SubnetConfiguration(name="public", cidr_mask=26, subnet_type=ec2.SubnetType.PUBLIC))
        vpc = ec2.Vpc(
            self, "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(settings.vpc_cidr),
            availability_zones=zone_names,
            nat_gateways=settings.nat_gateways,
            subnet_configuration=subnets,
            restrict_default_security_group=False,
            gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
        )
        flow_log_group = log_group(self, "FlowLogGroup", retention_days=settings.log_retention_days, key=log_key)
        vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
                         traffic_type=ec2.FlowLogTrafficType.ALL)
        return vpc

    def _add_endpoints(self, services):
        self.endpoint_security_group = ec2.SecurityGroup(
            self, "EndpointSecurityGroup", vpc=self.vpc, allow_all_outbound=False,
            description="lmstack interface endpoints: HTTPS from the training jobs only")
        self.endpoint_security_group.add_ingress_rule(
            self.training_security_group, ec2.Port.tcp(443), "AWS APIs from the training jobs")
        for name, service in (INTERFACE_ENDPOINTS[service] for service in services):
            self.vpc.add_interface_endpoint(
                name, service=service, private_dns_enabled=True, open=False,
                security_groups=[self.endpoint_security_group],
                subnets=ec2.SubnetSelection(subnets=self.subnets[:ENDPOINT_ZONES]))

