"""boto3 clients whose every call ends within a deadline: for the gate's Lambda function, which has a fixed time
(stacks.gate_code.TIMEOUT_SECONDS) and must answer "not checked" when a service hangs, not time out itself.

botocore's defaults would not: 60 s connect and read timeouts (botocore/endpoint.py DEFAULT_TIMEOUT) and the
legacy retry mode's attempts, so one hung call outlasts a 60 s function. `config(deadline)` gives standard
retries (botocore/retries/standard.py) with ATTEMPTS attempts and splits what the backoff leaves of `deadline`
between them: per attempt a connect timeout (a quarter) and a read timeout (the rest).

The worst case of standard mode's backoff before retry k (1-based) is min(2 ** (k - 1), 20) s
(ExponentialBackoff.delay_amount: rand(0, 1) * min(scale * 2 ** (k - 1), 20), scale 1 for a throttled
request), plus up to 5 s more where the service sends x-amz-retry-after (_RETRY_AFTER_MAX_ADDITIONAL).
A read timeout bounds each wait for data on the socket, so a service that stops answering ends the attempt.

Imports botocore only when a client is made (the Lambda runtime ships it; the plan never makes one).
"""
ATTEMPTS = 2  # the first request and one retry
MAX_BACKOFF_SECONDS = 20  # standard mode's cap on one backoff
RETRY_AFTER_SECONDS = 5  # what an x-amz-retry-after header may add to one backoff
CONNECT_SHARE = 0.25  # of an attempt's time, for connecting; the rest for reading


def backoff_seconds(attempts=ATTEMPTS):
    """The longest the retries of one call may sleep in all."""
    return sum(min(2 ** retry, MAX_BACKOFF_SECONDS) + RETRY_AFTER_SECONDS for retry in range(attempts - 1))


def timeouts(deadline):
    """(connect, read) seconds per attempt so that ATTEMPTS attempts and their backoff fit in `deadline`."""
    per_attempt = (deadline - backoff_seconds()) / ATTEMPTS
    if per_attempt <= 0:
        raise ValueError("deadline %r s leaves no time for %d attempts after %d s of backoff" % (
            deadline, ATTEMPTS, backoff_seconds()))
    return per_attempt * CONNECT_SHARE, per_attempt * (1 - CONNECT_SHARE)


def worst_case_seconds(connect, read, attempts=ATTEMPTS):
    """The longest one call of a client so configured may take: every attempt timing out, every backoff at most."""
    return attempts * (connect + read) + backoff_seconds(attempts)


def config(deadline):
    """The botocore Config of a client whose calls end within `deadline` seconds (module docstring)."""
    from botocore.config import Config

    connect, read = timeouts(deadline)
    return Config(connect_timeout=connect, read_timeout=read,
                  retries={"mode": "standard", "total_max_attempts": ATTEMPTS})


def client(name, region, deadline):
    """A boto3 client of service `name` in `region` (None: the runtime's, AWS_REGION in Lambda) whose calls end
    within `deadline` seconds."""
    import boto3

    return boto3.client(name, region_name=region, config=config(deadline))
