"""The strict data rules of tests/aws_rules.py. The EFS one (a stand-in for the file system SageMaker mounts, not EFS): a job
whose FileSystemDataSource DirectoryPath does not exist when it starts is rejected; a fresh file system has only
its root; a prepare job that mounts the root read-write makes its dataset directory. Ours passes; the layout
before this rule (the prepare job mounting the not-yet-existing dataset directory) and training on a fresh file
system fail."""
import copy

import aws_rules
from controlplane import request

FILE_SYSTEM = "fs-0123456789abcdef0"


def _job(kind, **changes):
    values = dict(kind=kind, name="lmstack-%s-1" % kind, image="image", role_arn="arn:aws:iam::123456789012:role/r",
                  bucket="bucket", region="us-east-1", hyperparameters={}, instance_type="ml.c5.18xlarge",
                  instance_count=1, max_runtime_seconds=3600, spot=False, file_system_id=FILE_SYSTEM,
                  security_group_ids=["sg-0123456789abcdef0"], subnets=["subnet-0123456789abcdef0"], data_directory="/datasets/pile",
                  execution_name="run-1", raw_s3_uri="s3://bucket/raw/pile/", dataset_key="key")
    values.update(changes)
    return request.create_training_job_request(request.TrainingJob(**values))


def _calls(*requests):
    return [("arn:aws:states:::aws-sdk:sagemaker:createTrainingJob", "createTrainingJob", parameters)
            for parameters in requests]


def test_prepare_then_train_passes_on_a_fresh_file_system():
    file_system = aws_rules.FileSystem(FILE_SYSTEM)
    assert aws_rules.check_requests(_calls(_job("prepare"), _job("train")), file_system) == []
    assert file_system.directories == {"/", "/datasets", "/datasets/pile"}


def test_training_on_a_fresh_file_system_is_rejected():
    problems = aws_rules.check_requests(_calls(_job("train")), aws_rules.FileSystem(FILE_SYSTEM))
    assert len(problems) == 1 and "efs_directories_exist" in problems[0] and "'/datasets/pile'" in problems[0]


def test_the_old_layout_mounting_the_dataset_directory_is_rejected():
    old = _job("prepare")
    old["InputDataConfig"][1]["DataSource"]["FileSystemDataSource"]["DirectoryPath"] = "/datasets/pile"
    file_system = aws_rules.FileSystem(FILE_SYSTEM)
    problems = aws_rules.check_requests(_calls(old, _job("train")), file_system)
    assert len(problems) == 2 and all("does not exist" in problem for problem in problems), problems
    assert file_system.directories == {"/"}  # a job that could not start made nothing


def test_an_efs_raw_directory_must_exist_too():
    efs_raw = _job("prepare", raw_s3_uri=None, raw_directory="/raw/pile")
    (problem,) = aws_rules.check_requests(_calls(efs_raw), aws_rules.FileSystem(FILE_SYSTEM))
    assert "InputDataConfig[raw]" in problem
    assert aws_rules.check_requests(_calls(efs_raw), aws_rules.FileSystem(FILE_SYSTEM, ["/raw/pile"])) == []


def test_a_read_only_or_training_job_makes_no_directory():
    read_only = _job("prepare")
    read_only["InputDataConfig"][1]["DataSource"]["FileSystemDataSource"]["FileSystemAccessMode"] = "ro"
    file_system = aws_rules.FileSystem(FILE_SYSTEM)
    assert aws_rules.check_requests(_calls(read_only), file_system) == []
    assert file_system.directories == {"/"}
    other_file_system = copy.deepcopy(_job("train"))
    other_file_system["InputDataConfig"][0]["DataSource"]["FileSystemDataSource"]["FileSystemId"] = "fs-0000000000000000f"
    assert aws_rules.check_requests(_calls(other_file_system), file_system) == []  # not the modelled file system


def test_an_s3_input_the_role_cannot_read_is_rejected():
    """s3_inputs_readable: our prepare request reads raw/ of the bucket, which the role may read; the same
    request with a prefix of another bucket fails."""
    readable = ("s3://bucket/raw/", "s3://bucket/models/")
    ours = _job("prepare")
    assert aws_rules.check_requests(_calls(ours), readable_prefixes=readable) == []
    elsewhere = _job("prepare", raw_s3_uri="s3://someone-else/pile/")
    (problem,) = aws_rules.check_requests(_calls(elsewhere), readable_prefixes=readable)
    assert "s3_inputs_readable" in problem and "InputDataConfig[raw]" in problem
    assert aws_rules.check_requests(_calls(elsewhere), readable_prefixes=readable + ("s3://someone-else/",)) == []


def test_a_value_outside_the_api_enum_is_refused():
    variant = {"VariantName": "AllTraffic", "ModelName": "lmstack-m", "InitialInstanceCount": 1}
    hostable = {"EndpointConfigName": "lmstack-c", "ProductionVariants": [dict(variant, InstanceType="ml.p3.2xlarge")]}
    assert aws_rules.api_constraints("CreateEndpointConfig", hostable) == []
    training_only = {"EndpointConfigName": "lmstack-c",
                     "ProductionVariants": [dict(variant, InstanceType="ml.p3dn.24xlarge")]}
    (problem,) = aws_rules.api_constraints("CreateEndpointConfig", training_only)
    assert "ProductionVariants[0].InstanceType" in problem and "ml.p3dn.24xlarge" in problem
