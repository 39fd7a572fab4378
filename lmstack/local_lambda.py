"""moto's Lambda, running the function's own code: the gate runs here as Lambda runs it.

moto 5 without Docker does not run a function's code: its invoke echoes the payload, or answers what
a test queued. `local_lambda()` patches moto's `LambdaFunction.invoke` so that an invocation runs the
code the function was created with. Its zip is unpacked once, and a worker process runs the handler
as the Lambda Python runtime does: on the runtime's interpreter (`runtime_interpreter`: python3.13 for the
gate's `python3.13`, found on PATH or among pyenv's versions), the handler string `package.module.function`
imported from the unpacked code, the function's environment variables (and credentials, as Lambda sets
them) as the process's environment, and an exception returned as the invocation's error
(`FunctionError: Unhandled`, a payload of `errorType`, `errorMessage` and `stackTrace`, as Lambda reports
it; a handler that cannot be imported is `Runtime.ImportModuleError`). The worker is `python -I -S -B`:
the standard library, the function's code and the AWS SDK the Lambda Python runtime ships (boto3 and
botocore with their dependencies, taken from this environment), nothing else of this process's packages.
It stays up between invocations, as a warm Lambda execution environment does, and ends when its stdin
closes (at this process's exit at the latest).

The worker reaches no AWS: its SDK's requests are answered by `lmstack.local_service_quotas` (Service
Quotas, the one service the gate asks), with the quota table `LocalLambda.service_quotas` holds when the
function is invoked (None: an account that answers nothing, as without network: botocore's
EndpointConnectionError); every other service raises EndpointConnectionError. The requests each invocation
made are recorded with it (`Invocation.aws_calls`). The stand-ins answer or fail at once, so a retry of the
SDK is sent without the backoff botocore would sleep first (`botocore.endpoint`'s only use of `time`; up to a
second in standard mode, per call): the same attempts and answer, without a second of nothing per invocation.

`deploy_gate` stages the gate's code (`stacks.gate_code.stage`, what `cdk synth` puts in the asset), creates
the function in moto's Lambda and publishes a version, as the stack does. Every invocation is recorded
(`LocalLambda.invocations`): the tests assert that the gate ran.
"""
import atexit
import contextlib
import dataclasses
import functools
import glob
import importlib.util
import io
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
import zipfile
from typing import Any, List

# The packages of the AWS SDK the Lambda Python runtime provides (boto3, botocore and what they import).
SDK_PACKAGES = ("boto3", "botocore", "jmespath", "dateutil", "s3transfer", "urllib3", "six")
# Credentials in the function's environment, as Lambda sets the role's: never valid anywhere, and the
# worker reaches no AWS (the module docstring).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "local-lambda", "AWS_SECRET_ACCESS_KEY": "local-lambda",
               "AWS_SESSION_TOKEN": "local-lambda"}

# The worker: one JSON request a line on stdin ({"event": ..., "service_quotas": table or null}), one JSON
# reply a line on the original stdout ({"result" or "error", "aws_calls"}); whatever the handler prints goes
# to stderr. argv: the unpacked code, the handler, the directory of the SDK and the Service Quotas stand-in.
_WORKER = r"""
import importlib, json, os, sys, traceback, types
task_root, handler, sdk = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, task_root)
sys.path.append(sdk)
replies = os.fdopen(os.dup(1), "w")
sys.stdout = sys.stderr
import boto3, botocore.endpoint, local_service_quotas
botocore.endpoint.time = types.SimpleNamespace(sleep=lambda seconds: None)
answering = [local_service_quotas.ServiceQuotas(reachable=False)]
boto3.setup_default_session()
boto3.DEFAULT_SESSION.events.register_first("before-send.service-quotas",
                                            lambda request, **kwargs: answering[0].send(request))
boto3.DEFAULT_SESSION.events.register("before-send", local_service_quotas.unreachable)
module_name, _, function_name = handler.rpartition(".")
try:
    function = getattr(importlib.import_module(module_name), function_name)
    failure = None
except Exception as error:
    function = None
    failure = {"errorType": "Runtime.ImportModuleError", "errorMessage": "Unable to import module %r: %s"
               % (module_name, error), "stackTrace": traceback.format_exc().splitlines()}
for line in sys.stdin:
    request = json.loads(line)
    event, table = request["event"], request["service_quotas"]
    answering[0] = (local_service_quotas.ServiceQuotas.from_json(table) if table
                    else local_service_quotas.ServiceQuotas(reachable=False))
    if function is None:
        reply = {"error": failure}
    else:
        try:
            reply = {"result": function(event, None)}
        except Exception as error:
            reply = {"error": {"errorType": type(error).__name__, "errorMessage": str(error),
                               "stackTrace": traceback.format_exc().splitlines()}}
    reply["aws_calls"] = answering[0].calls
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
"""


@functools.lru_cache(maxsize=None)
def runtime_interpreter(runtime):
    """The interpreter of Lambda's Python runtime `runtime` (`python3.13`) on this machine: the first of
    `python3.13` on PATH and pyenv's 3.13.x (under `pyenv root`, $PYENV_ROOT or ~/.pyenv, newest first) that
    runs and says it is 3.13 (pyenv's shim on PATH runs only where 3.13 is selected). RuntimeError saying how
    to get one when there is none: the function's code is tested on the Python it runs on."""
    version = runtime[len("python"):]
    roots = [os.environ.get("PYENV_ROOT"), os.path.expanduser("~/.pyenv")]
    if shutil.which("pyenv"):
        roots.insert(0, subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip())
    candidates = [shutil.which(runtime)]
    for root in dict.fromkeys(filter(None, roots)):
        candidates += sorted(glob.glob(os.path.join(root, "versions", version + ".*", "bin", runtime)), reverse=True,
                             key=lambda path: [int(part) for part in path.split(os.sep)[-3].split(".") if part.isdigit()])
    for candidate in filter(None, candidates):
        answered = subprocess.run([candidate, "-c", "import sys; print('python%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True)
        if answered.returncode == 0 and answered.stdout.strip() == runtime:
            return candidate
    raise RuntimeError(
        "the gate's Lambda runtime is %s (stacks.gate_code.RUNTIME), and its code is tested on that Python: no "
        "%s runs from PATH or under pyenv's versions. Install it (`pyenv install %s`, or your system's package) "
        "and run again" % (runtime, runtime, version))


def sdk_directory(directory):
    """`directory` holding the AWS SDK's packages (links to this environment's: pure Python, as Lambda's
    runtime ships them) and the Service Quotas stand-in the worker answers with."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for package in SDK_PACKAGES:
        spec = importlib.util.find_spec(package)
        source = pathlib.Path(spec.origin)
        source = source.parent if source.name == "__init__.py" else source
        link = directory / source.name
        if not link.exists():
            link.symlink_to(source)
    shutil.copyfile(pathlib.Path(__file__).with_name("local_service_quotas.py"), directory / "local_service_quotas.py")
    return directory


class _Worker:
    """One warm execution environment: a `python -I -S` process of the function's runtime serving its handler."""

    def __init__(self, interpreter, task_root, handler, sdk, environment):
        self.lock = threading.Lock()
        self.process = subprocess.Popen(
            [interpreter, "-I", "-S", "-B", "-c", _WORKER, str(task_root), handler, str(sdk)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=dict(environment), text=True)

    def call(self, event, service_quotas):
        with self.lock:
            self.process.stdin.write(json.dumps({"event": event, "service_quotas": service_quotas}) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the local Lambda worker for %s ended (exit status %s)"
                               % (self.process.args[6], self.process.poll()))
        return json.loads(line)

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=30)


@dataclasses.dataclass
class Invocation:
    function_arn: str
    event: Any
    payload: Any
    error: bool
    aws_calls: List[Any] = dataclasses.field(default_factory=list)  # [operation, parameters] the SDK sent


class LocalLambda:
    """The code and workers of every function invoked in this process (kept across mocks, like warm
    environments), the invocations made while `local_lambda()` was active, and the Service Quotas table
    (`lmstack.local_service_quotas.ServiceQuotas`, or None) the functions' AWS SDK is answered from."""

    def __init__(self):
        self.invocations: List[Invocation] = []
        self.service_quotas = None
        self._roots = {}    # code sha256 -> unpacked directory
        self._workers = {}  # (code sha256, handler, runtime, environment) -> _Worker
        self._lock = threading.Lock()
        self._scratch = tempfile.TemporaryDirectory(prefix="local-lambda-")
        self._sdk = None

    def _worker(self, function):
        environment = tuple(sorted(function.environment_vars.items()))
        key = (function.code_sha_256, function.handler, function.run_time, environment)
        with self._lock:
            if key not in self._workers:
                root = self._roots.get(function.code_sha_256)
                if root is None:
                    root = pathlib.Path(self._scratch.name) / ("code-%d" % len(self._roots))
                    with zipfile.ZipFile(io.BytesIO(function.code_bytes)) as archive:
                        archive.extractall(root)
                    self._roots[function.code_sha_256] = root
                if self._sdk is None:
                    self._sdk = sdk_directory(pathlib.Path(self._scratch.name) / "sdk")
                lambda_environment = dict(CREDENTIALS, AWS_LAMBDA_FUNCTION_NAME=function.function_name,
                                          AWS_REGION=function.region, AWS_DEFAULT_REGION=function.region,
                                          LANG="C.UTF-8")
                self._workers[key] = _Worker(runtime_interpreter(function.run_time), root, function.handler,
                                             self._sdk, dict(lambda_environment, **dict(environment)))
            return self._workers[key]

    def invoke(self, function, body, request_headers, response_headers):
        """moto's LambdaFunction.invoke: the function's handler on the event; the payload as bytes."""
        event = json.loads(body) if body else {}
        table = self.service_quotas.to_json() if self.service_quotas is not None else None
        reply = self._worker(function).call(event, table)
        error = "error" in reply
        if error:
            response_headers["x-amz-function-error"] = "Unhandled"
        payload = reply["error"] if error else reply["result"]
        self.invocations.append(Invocation(function.function_arn, event, payload, error, reply["aws_calls"]))
        return json.dumps(payload).encode("utf-8")

    def close(self):
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()
        self._scratch.cleanup()


RUNTIME = LocalLambda()
atexit.register(RUNTIME.close)


@contextlib.contextmanager
def local_lambda():
    """moto's Lambda runs each function's code (the module docstring); yields the LocalLambda, whose
    `invocations` are those made inside this block."""
    from moto.awslambda import models

    original = models.LambdaFunction.invoke
    start = len(RUNTIME.invocations)

    def invoke(function, body, request_headers, response_headers):
        return RUNTIME.invoke(function, body, request_headers, response_headers)

    models.LambdaFunction.invoke = invoke
    try:
        yield RUNTIME
    finally:
        models.LambdaFunction.invoke = original
        RUNTIME.service_quotas = None
        del RUNTIME.invocations[start:]


def code_zip(directory):
    """The zip Lambda gets of a staged directory (what `Code.from_asset` uploads), entries in a fixed order."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(pathlib.Path(directory).rglob("*")):
            if path.is_file():
                info = zipfile.ZipInfo(path.relative_to(directory).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
                archive.writestr(info, path.read_bytes())
    return buffer.getvalue()


def deploy_gate(iam, lambda_client, settings, directory):
    """Stage the gate's code into `directory` and `create_gate` from it; the version's ARN."""
    from stacks import gate_code

    return create_gate(iam, lambda_client, settings, gate_code.stage(directory))


def create_gate(iam, lambda_client, settings, code):
    """Create the gate's function from the staged directory `code` in (moto's) Lambda, the deployment's
    settings in its environment, as the stack does (`stacks.gate`), and publish a version; returns that
    version's ARN, which the definition's `${GateFunctionArn}` stands for."""
    from controlplane.gate import Deployment
    from stacks import gate_code

    name = "%s-gate" % settings.name_prefix
    role = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "lambda.amazonaws.com"}}]}))["Role"]["Arn"]
    lambda_client.create_function(
        FunctionName=name, Runtime=gate_code.RUNTIME, Role=role, Handler=gate_code.HANDLER,
        Code={"ZipFile": code_zip(code)}, Timeout=gate_code.TIMEOUT_SECONDS, MemorySize=gate_code.MEMORY_MB,
        Environment={"Variables": Deployment.of(settings).environment()})
    return lambda_client.publish_version(FunctionName=name)["FunctionArn"]

