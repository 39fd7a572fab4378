"""The gate's quota check (`controlplane.gate.check_quotas`, `controlplane.quotas`): the SageMaker quotas a run
needs, read by name from Service Quotas (`lmstack.local_service_quotas`, answered through botocore with tables
of `quota_tables`), refuse before any job; a Service Quotas that cannot answer is noted, not refused."""
import socket
import threading

import pytest

import quota_tables
from state_machine.harness import StandInSettings

from controlplane import aws_clients, gate, quotas
from stacks import gate_code
from stacks.gate import QUOTA_ACTIONS

pytestmark = pytest.mark.usefixtures("sdk_retries_at_once")

DEPLOYMENT = gate.Deployment.of(StandInSettings())
RUN = {"preset": "gpt-125m", "strategy": "smddp", "instance_type": "ml.p4d.24xlarge", "instance_count": 2,
       "fallback_instance_types": ["ml.p5.48xlarge"], "hyperparameters": {"global_batch_size": 64, "max_steps": 20},
       "deploy": {"enabled": True, "instance_type": "ml.g5.12xlarge", "instance_count": 2}}


def decide(execution_input, table, launch=0):
    return gate.decide(execution_input, gate.Context(DEPLOYMENT, clients=quota_tables.clients(table)), launch=launch)


def test_enough_quota_passes_and_every_quota_is_read_by_its_name():
    table = quota_tables.account(default=2)
    decision = decide(RUN, table)
    assert not [note for note in decision.notes if "quota" in note.lower()]
    operations = [operation for operation, _ in table.calls]
    # the applied values, page after page until every name was found; no defaults needed
    assert set(operations) == {"ListServiceQuotas"} and len(operations) > 1
    assert all(parameters["ServiceCode"] == "sagemaker" and parameters["MaxResults"] == quotas.PAGE_SIZE
               for _, parameters in table.calls)
    assert table.calls[1][1]["NextToken"]


@pytest.mark.parametrize("short, named", [
    ("ml.p4d.24xlarge for training job usage", "instance_type ml.p4d.24xlarge: 2 instance(s) for the training job"),
    ("ml.p5.48xlarge for training job usage",
     "fallback_instance_types[0] ml.p5.48xlarge: 2 instance(s) for the training job"),
    ("ml.g5.12xlarge for endpoint usage", "deploy.instance_type ml.g5.12xlarge: 2 instance(s) for the endpoint"),
    ("Maximum number of instances per training job", "instance_type ml.p4d.24xlarge: 2 instance(s)"),
])
def test_a_quota_below_the_request_is_refused_naming_the_quota_its_value_and_the_request(short, named):
    with pytest.raises(gate.Refusal) as refused:
        decide(RUN, quota_tables.account({short: 1}, default=8))
    assert refused.value.error == gate.QUOTA_TOO_LOW
    message = str(refused.value)
    assert named in message and '"%s" (%s, applied value) is 1' % (short, quota_tables.code(short)) in message


def test_spot_and_the_prepare_job_ask_their_own_quotas():
    spot = dict(RUN, spot=True, fallback_instance_types=[],
                prepare={"enabled": True, "instance_type": "ml.c5.18xlarge", "raw_s3_uri": "s3://bucket/raw/"})
    for short in ("ml.p4d.24xlarge for spot training job usage", "Number of instances across all spot training jobs",
                  "ml.c5.18xlarge for training job usage"):
        with pytest.raises(gate.Refusal, match='"%s"' % short):
            decide(spot, quota_tables.account({short: 0}))
    # the on-demand quota of the type does not hold a spot run back
    decide(spot, quota_tables.account({"ml.p4d.24xlarge for training job usage": 0}))


def test_the_evaluation_job_asks_the_quota_of_its_instance_type():
    evaluated = dict(RUN, evaluate={"enabled": True, "instance_type": "ml.m5.4xlarge"})
    with pytest.raises(gate.Refusal, match='evaluate.instance_type ml.m5.4xlarge: 1 instance.s. for the evaluate job.*'
                                           '"ml.m5.4xlarge for training job usage"'):
        decide(evaluated, quota_tables.account({"ml.m5.4xlarge for training job usage": 0}, default=8))
    decide(RUN, quota_tables.account({"ml.m5.4xlarge for training job usage": 0}, default=8))


def test_a_warm_pool_over_its_quota_is_a_note_that_no_pool_will_be_kept():
    # "If a training job is created with KeepAlivePeriodInSeconds specified, but you did not request a warm pool
    # limit increase, then a warm pool is not retained" (SageMaker developer guide, train-warm-pools)
    short = "ml.p4d.24xlarge for training warm pool usage"
    decision = decide(dict(RUN, keep_alive_seconds=600, fallback_instance_types=[]), quota_tables.account({short: 0}))
    (note,) = [note for note in decision.notes if short in note]
    assert note == ('instance_type ml.p4d.24xlarge: 2 instance(s) for the training job kept warm (keep_alive_seconds), '
                    'and the quota "%s" (%s, applied value) is 0: SageMaker runs the job but keeps no warm pool '
                    '(keep_alive_seconds has no effect until the quota is raised)' % (short, quota_tables.code(short)))
    assert decision.config["keep_alive_seconds"] == 600


def test_spot_with_a_warm_pool_is_refused_naming_both_fields():
    # "SageMaker Managed Warm Pools cannot be used with spot instances" (train-warm-pools, "Considerations")
    with pytest.raises(gate.Refusal) as refused:
        decide(dict(RUN, spot=True, keep_alive_seconds=600), quota_tables.account())
    assert refused.value.error == gate.INVALID
    assert "spot true and keep_alive_seconds 600" in str(refused.value)


@pytest.mark.parametrize("code, message", [
    ("DEPENDENCY_ACCESS_DENIED_ERROR", "The caller does not have the required permissions"),
    ("SERVICE_QUOTA_NOT_AVAILABLE_ERROR", "The quota value is not available"),
])
def test_a_quota_service_quotas_cannot_read_is_not_checked_and_says_why(code, message):
    # an entry of ListServiceQuotas with an ErrorReason and no Value; its default (0) would refuse the run
    name = "ml.p4d.24xlarge for training job usage"
    table = quota_tables.account({name: 0}, default=8, errors_of={name: (code, message)})
    decision = decide(RUN, table)
    assert 'Service Quotas gives no value for "%s" (%s): %s %s: not checked' % (
        name, quota_tables.code(name), code, message) in decision.notes
    assert "ListAWSDefaultServiceQuotas" not in [operation for operation, _ in table.calls]


def test_a_quota_with_only_a_default_value_is_read_from_the_defaults():
    name = "ml.p4d.24xlarge for training job usage"
    table = quota_tables.account({name: 0}, default=8, defaults_only=[name])
    with pytest.raises(gate.Refusal, match='"%s" \\(%s, default value\\) is 0' % (name, quota_tables.code(name))):
        decide(RUN, table)
    assert [operation for operation, _ in table.calls][-1] == "ListAWSDefaultServiceQuotas"
    # what the gate's role may do (stacks.gate) is exactly what the check calls
    assert {"servicequotas:" + operation for operation, _ in table.calls} == set(QUOTA_ACTIONS)


def test_a_fallback_launch_asks_only_its_own_type_and_the_endpoint():
    table = quota_tables.account({"ml.p4d.24xlarge for training job usage": 0}, default=8)
    decision = decide(RUN, table, launch=1)  # the first type is behind it now
    assert decision.config["instance_type"] == "ml.p5.48xlarge"


@pytest.mark.parametrize("error", [("AccessDeniedException", "User is not authorized to perform servicequotas"),
                                   ("TooManyRequestsException", "Rate exceeded")])
def test_when_service_quotas_cannot_answer_the_notes_say_so_and_the_run_goes_on(error):
    decision = decide(RUN, quota_tables.account(errors={"ListServiceQuotas": error}))
    assert "Service Quotas could not answer (%s: %s): the SageMaker quotas this run needs were not checked" % error \
        in decision.notes


def test_a_name_service_quotas_does_not_list_is_noted_not_refused():
    table = quota_tables.account(default=8)
    table.quotas = tuple(quota for quota in table.quotas if quota.name != quotas.ALL_TRAINING_JOBS)
    decision = decide(RUN, table)
    assert 'Service Quotas lists no SageMaker quota named "%s": not checked' % quotas.ALL_TRAINING_JOBS in decision.notes


def test_a_caller_that_does_not_ask_aws_says_so():
    assert "quotas not checked: this caller does not ask AWS" in gate.decide(RUN, gate.Context(DEPLOYMENT)).notes


# ---- through the state machine, the gate's function answered by the Service Quotas stand-in ----

def test_a_run_over_its_quota_fails_before_any_job_naming_the_quota(deployment):
    short = "ml.g5.2xlarge for training job usage"
    deployment.quotas(quota_tables.account({short: 0}))
    run = deployment.run({"hyperparameters": {"max_steps": 3}})
    assert (run.status, run.description["error"]) == ("FAILED", gate.QUOTA_TOO_LOW)
    assert '"%s" (%s, applied value) is 0' % (short, quota_tables.code(short)) in run.description["cause"]
    assert deployment.jobs.created == []
    assert {operation for operation, _ in run.gate_invocations()[0].aws_calls} == {"ListServiceQuotas"}


def test_a_run_with_enough_quota_trains(deployment):
    deployment.quotas(quota_tables.account(default=1))
    run = deployment.run({"hyperparameters": {"max_steps": 3}})
    assert run.status == "SUCCEEDED", run.description.get("cause")
    assert len(deployment.jobs.created) == 1 and run.gate_invocations()[0].aws_calls


def test_without_an_answer_from_service_quotas_the_run_trains_and_the_topic_hears_why(deployment):
    refused = ("AccessDeniedException", "User: arn:aws:sts::123456789012:assumed-role/lmstack-gate is not authorized "
                                        "to perform: servicequotas:ListServiceQuotas")
    deployment.quotas(quota_tables.account(errors={"ListServiceQuotas": refused}))
    run = deployment.run({"hyperparameters": {"max_steps": 3}})
    assert run.status == "SUCCEEDED", run.description.get("cause")
    assert len(deployment.jobs.created) == 1
    assert any("Service Quotas could not answer (%s: %s)" % refused in message for message in deployment.notifications())


# ---- a Service Quotas that does not answer: the gate's calls end within its function's time ----

@pytest.fixture
def silent_endpoint(monkeypatch):
    """A local HTTP endpoint that accepts connections and never answers, as Service Quotas' endpoint for the
    SDK (botocore reads AWS_ENDPOINT_URL_SERVICE_QUOTAS); yields the connections it accepted."""
    accepted = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def accept():
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:  # closed at the end of the test
                return

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", "http://127.0.0.1:%d" % server.getsockname()[1])
    for name, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    yield accepted
    server.close()
    for connection in accepted:
        connection.close()


def test_a_service_quotas_that_never_answers_is_noted_after_the_clients_attempts(silent_endpoint):
    deadline = 8  # seconds: 0.25 s to connect and 0.75 s to read per attempt, after 6 s of backoff at most
    context = gate.Context(DEPLOYMENT, clients=lambda service, region_name=None: aws_clients.client(
        service, region_name, deadline))
    decision = gate.decide(RUN, context)
    (note,) = [note for note in decision.notes if "Service Quotas could not answer" in note]
    assert "ReadTimeoutError" in note and note.endswith("the SageMaker quotas this run needs were not checked")
    assert len(silent_endpoint) == aws_clients.ATTEMPTS  # each attempt ended by its read timeout, then no more


def test_the_gates_clients_end_their_calls_inside_the_functions_time(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    config = gate.aws_client("service-quotas").meta.config
    assert config.retries == {"mode": "standard", "total_max_attempts": aws_clients.ATTEMPTS}
    one_call = aws_clients.worst_case_seconds(config.connect_timeout, config.read_timeout)
    assert one_call <= gate.AWS_CALL_SECONDS
    # pages are asked for until QUOTA_SECONDS, the last may take a whole call; planning has the rest
    assert gate.QUOTA_SECONDS + gate.AWS_CALL_SECONDS < gate_code.TIMEOUT_SECONDS


def test_no_page_is_asked_for_after_the_time_the_listing_has():
    table = quota_tables.account(default=8)
    client = quota_tables.clients(table)("service-quotas")
    now = [0.0]

    def clock():
        now[0] += 1.0  # a second a page
        return now[0]

    with pytest.raises(quotas.TooSlow):
        quotas.look_up(client, [need.quota for need in gate.quota_needs(gate.decide(RUN, gate.Context(DEPLOYMENT)))],
                       seconds=2.5, clock=clock)
    assert len(table.calls) == 2
