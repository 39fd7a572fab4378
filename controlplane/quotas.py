"""The SageMaker quotas a run needs, and what Service Quotas says this account has: the gate's quota check.

SageMaker's per-account quotas for GPU types are often 0 on a new account, and SageMaker refuses a job or an
endpoint only when it is created (CreateTrainingJob's ResourceLimitExceeded "account-level service limit"):
a run that trains and then deploys would learn about the endpoint's quota after training. The gate
(`controlplane.gate.check_quotas`) asks Service Quotas before any job and refuses a run that needs more
instances than a quota allows, naming the quota, its value and the request.

The quotas are found by their names, which Service Quotas lists for service code `sagemaker` (the Service
Quotas console's, and what AWS's own guides name: "ml.p4d.24xlarge for training job usage"); their codes
(L-...) are read from the listing at run time, not kept here. `needs` says which quotas a run needs and how
many instances of each; `look_up` reads them: ListServiceQuotas (the applied values; it leaves out a quota
whose applied value is not available), then ListAWSDefaultServiceQuotas (the defaults) for the names the
first listing did not give. A name neither lists is noted as not checked, not refused: names can change.
An applied entry with an ErrorReason (ServiceQuota.ErrorReason {ErrorCode, ErrorMessage}, botocore's
service-quotas model: e.g. DEPENDENCY_ACCESS_DENIED_ERROR, Service Quotas could not read the value) is noted as
not checked with that reason, never judged by the default: the account's value may differ from it.

The warm-pool quota ("... for training warm pool usage") refuses nothing: "The default resource limit for warm
pools is 0. If a training job is created with KeepAlivePeriodInSeconds specified, but you did not request a
warm pool limit increase, then a warm pool is not retained" (SageMaker developer guide, train-warm-pools,
"Considerations"): the job runs, without a pool, and the note says so.

What is compared is the quota's value with the instances this run asks for at once: instances that other
jobs or endpoints of the account hold at that time are not counted (that would need ListTrainingJobs and
ListEndpoints too), so a run can still meet the limit if the account is busy.

Pure Python: the client is whatever the caller passes (a boto3 client in the Lambda function).
"""
import dataclasses
import time
from typing import Optional

SERVICE_CODE = "sagemaker"
PAGE_SIZE = 100  # MaxResults' maximum for both listings (Service Quotas API reference)
# Quota names, per instance type ({} is the type) and for the account.
TRAINING = "{} for training job usage"
SPOT_TRAINING = "{} for spot training job usage"
WARM_POOL = "{} for training warm pool usage"
ENDPOINT = "{} for endpoint usage"
PER_TRAINING_JOB = "Maximum number of instances per training job"
ALL_TRAINING_JOBS = "Number of instances across all training jobs"
ALL_SPOT_TRAINING_JOBS = "Number of instances across all spot training jobs"


@dataclasses.dataclass(frozen=True)
class Need:
    """`instances` of quota `quota` at once, for `purpose` (in the input's words). `when_short`: None where
    AWS refuses the job over the quota, else what happens instead (the note the run gets)."""
    quota: str
    instances: int
    purpose: str
    when_short: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Found:
    """A quota as Service Quotas lists it: its code, value (None when it could not say) and which listing."""
    code: str
    value: object
    source: str  # "applied" or "default"
    reason: str = ""  # the quota's ErrorReason, when its value is not available


def training_needs(config, label):
    """The quotas one training launch of `config` needs: its type (on demand or spot), the instances of one
    job and of all jobs, and the warm pool it keeps (`keep_alive_seconds`). `label`: where the type comes from."""
    instance_type, count, spot = config["instance_type"], config["instance_count"], config["spot"]
    purpose = "%s %s: %d instance(s) for the %straining job" % (label, instance_type, count, "spot " if spot else "")
    needs = [Need((SPOT_TRAINING if spot else TRAINING).format(instance_type), count, purpose),
             Need(PER_TRAINING_JOB, count, purpose),
             Need(ALL_SPOT_TRAINING_JOBS if spot else ALL_TRAINING_JOBS, count, purpose)]
    if config["keep_alive_seconds"]:
        needs.append(Need(WARM_POOL.format(instance_type), count, purpose + " kept warm (keep_alive_seconds)",
                          when_short="SageMaker runs the job but keeps no warm pool (keep_alive_seconds has no "
                                     "effect until the quota is raised)"))
    return needs


def prepare_needs(prepare):
    """The prepare job's quotas (an on-demand training job)."""
    purpose = "prepare.instance_type %s: %d instance(s) for the prepare job" % (prepare["instance_type"],
                                                                               prepare["instance_count"])
    return [Need(TRAINING.format(prepare["instance_type"]), prepare["instance_count"], purpose),
            Need(PER_TRAINING_JOB, prepare["instance_count"], purpose),
            Need(ALL_TRAINING_JOBS, prepare["instance_count"], purpose)]


def endpoint_needs(deploy):
    purpose = "deploy.instance_type %s: %d instance(s) for the endpoint" % (deploy["instance_type"],
                                                                           deploy["instance_count"])
    return [Need(ENDPOINT.format(deploy["instance_type"]), deploy["instance_count"], purpose)]


class TooSlow(Exception):
    """Service Quotas' listings took longer than the caller allows."""


def _pages(call, give_up_at, clock, **request):
    """Every quota of a listing, page after page (NextToken until there is none); TooSlow rather than ask for
    another page after `give_up_at` (on `clock`)."""
    token = None
    while True:
        if clock() > give_up_at:
            raise TooSlow("Service Quotas' listings took more than the gate allows them")
        page = call(**dict(request, NextToken=token) if token else request)
        yield from page.get("Quotas", [])
        token = page.get("NextToken")
        if not token:
            return


def _found(quota, source):
    reason = quota.get("ErrorReason") or {}
    return Found(quota.get("QuotaCode", "?"), quota.get("Value"), source,
                 " ".join(str(reason.get(key, "")) for key in ("ErrorCode", "ErrorMessage")).strip())


def look_up(client, names, seconds=float("inf"), clock=time.monotonic):
    """{name: Found} for each quota of `names` that Service Quotas lists for SageMaker (module docstring); no
    page asked for after `seconds` (TooSlow). The SDK's errors (AccessDenied, throttling, no endpoint) are the
    caller's to handle."""
    wanted = set(names)
    found = {}
    give_up_at = clock() + seconds
    for listing, source in ((client.list_service_quotas, "applied"), (client.list_aws_default_service_quotas,
                                                                       "default")):
        for quota in _pages(listing, give_up_at, clock, ServiceCode=SERVICE_CODE, MaxResults=PAGE_SIZE):
            name = quota.get("QuotaName")
            if name in wanted and name not in found and (source == "default" or quota.get("Value") is not None
                                                         or quota.get("ErrorReason")):
                found[name] = _found(quota, source)
            if wanted <= set(found):
                return found
    return found


def compare(needs, found):
    """(shortfalls, notes): a phrase per need above its quota's value that AWS refuses; a note per need above
    its quota that AWS runs otherwise (`Need.when_short`), and per quota not checked."""
    shortfalls, notes = [], []
    for name in dict.fromkeys(need.quota for need in needs):
        if name not in found:
            notes.append("Service Quotas lists no SageMaker quota named \"%s\": not checked" % name)
        elif found[name].value is None:
            notes.append("Service Quotas gives no value for \"%s\" (%s)%s: not checked" % (
                name, found[name].code, ": " + found[name].reason if found[name].reason else ""))
    for need in needs:
        quota = found.get(need.quota)
        if quota is None or quota.value is None or quota.value >= need.instances:
            continue
        if need.when_short:
            notes.append("%s, and the quota \"%s\" (%s, %s value) is %g: %s" % (
                need.purpose, need.quota, quota.code, quota.source, quota.value, need.when_short))
        else:
            shortfalls.append("%s, and the quota \"%s\" (%s, %s value) is %g" % (
                need.purpose, need.quota, quota.code, quota.source, quota.value))
    return list(dict.fromkeys(shortfalls)), list(dict.fromkeys(notes))


def describe_error(error):
    """An AWS SDK error in a line: botocore's ClientError carries the service's code and message."""
    response = getattr(error, "response", None)
    if isinstance(response, dict) and "Error" in response:
        return "%s: %s" % (response["Error"].get("Code", "?"), response["Error"].get("Message", ""))
    return "%s: %s" % (type(error).__name__, error)
