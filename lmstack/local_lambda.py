"""moto's Lambda, running the function's own code: the gate runs here as Lambda runs it.

moto 5 without Docker does not run a function's code: its invoke echoes the payload, or answers what
a test queued. `local_lambda()` patches moto's `LambdaFunction.invoke` so that an invocation runs the
code the function was created with. Its zip is unpacked once, and a worker process runs the handler
as the Lambda Python runtime does: the handler string `package.module.function` imported from the
unpacked code, the function's environment variables as the process's environment, and an exception
returned as the invocation's error (`FunctionError: Unhandled`, a payload of `errorType`,
`errorMessage` and `stackTrace`, as Lambda reports it; a handler that cannot be imported is
`Runtime.ImportModuleError`). The worker is `python -I -S -B`: the standard library and the function's
code, none of this process's packages. It stays up between invocations, as a warm Lambda execution
environment does, and ends when its stdin closes (at this process's exit at the latest).

The worker is stricter than Lambda's Python runtime, which also provides the AWS SDK (boto3): a handler
that calls AWS needs boto3 on the worker's path and an endpoint it can reach (moto's in-process mock is
not; moto's server mode and AWS_ENDPOINT_URL in the function's environment would be). The gate calls no
AWS today; a check that does is tested with `controlplane.gate.Context.clients` injected.

`deploy_gate` stages the gate's code (`stacks.gate_code.stage`, what `cdk synth` puts in the asset), creates
the function in moto's Lambda and publishes a version, as the stack does. Every invocation is recorded
(`LocalLambda.invocations`): the tests assert that the gate ran.
"""
import atexit
import contextlib
import dataclasses
import io
import json
import pathlib
import subprocess
import sys
import tempfile
import threading
import zipfile
from typing import Any, List

# The worker: one JSON request a line on stdin ({"event": ...}), one JSON reply a line on the original
# stdout; whatever the handler prints goes to stderr.
_WORKER = r"""
import importlib, json, os, sys, traceback
task_root, handler = sys.argv[1], sys.argv[2]
sys.path.insert(0, task_root)
replies = os.fdopen(os.dup(1), "w")
sys.stdout = sys.stderr
module_name, _, function_name = handler.rpartition(".")
try:
    function = getattr(importlib.import_module(module_name), function_name)
    failure = None
except Exception as error:
    function = None
    failure = {"errorType": "Runtime.ImportModuleError", "errorMessage": "Unable to import module %r: %s"
               % (module_name, error), "stackTrace": traceback.format_exc().splitlines()}
for line in sys.stdin:
    event = json.loads(line)["event"]
    if function is None:
        reply = {"error": failure}
    else:
        try:
            reply = {"result": function(event, None)}
        except Exception as error:
            reply = {"error": {"errorType": type(error).__name__, "errorMessage": str(error),
                               "stackTrace": traceback.format_exc().splitlines()}}
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
"""


class _Worker:
    """One warm execution environment: a `python -I -S` process serving a function's handler."""

    def __init__(self, task_root, handler, environment):
        self.lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", _WORKER, str(task_root), handler], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=dict(environment), text=True)

    def call(self, event):
        with self.lock:
            self.process.stdin.write(json.dumps({"event": event}) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the local Lambda worker for %s ended (exit status %s)"
                               % (self.process.args[3], self.process.poll()))
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


class LocalLambda:
    """The code and workers of every function invoked in this process (kept across mocks, like warm
    environments), and the invocations made while `local_lambda()` was active."""

    def __init__(self):
        self.invocations: List[Invocation] = []
        self._roots = {}    # code sha256 -> unpacked directory
        self._workers = {}  # (code sha256, handler, environment) -> _Worker
        self._lock = threading.Lock()
        self._scratch = tempfile.TemporaryDirectory(prefix="local-lambda-")

    def _worker(self, function):
        environment = tuple(sorted(function.environment_vars.items()))
        key = (function.code_sha_256, function.handler, environment)
        with self._lock:
            if key not in self._workers:
                root = self._roots.get(function.code_sha_256)
                if root is None:
                    root = pathlib.Path(self._scratch.name) / ("code-%d" % len(self._roots))
                    with zipfile.ZipFile(io.BytesIO(function.code_bytes)) as archive:
                        archive.extractall(root)
                    self._roots[function.code_sha_256] = root
                lambda_environment = {"AWS_LAMBDA_FUNCTION_NAME": function.function_name,
                                      "AWS_REGION": function.region, "LANG": "C.UTF-8"}
                self._workers[key] = _Worker(root, function.handler, dict(lambda_environment, **dict(environment)))
            return self._workers[key]

    def invoke(self, function, body, request_headers, response_headers):
        """moto's LambdaFunction.invoke: the function's handler on the event; the payload as bytes."""
        event = json.loads(body) if body else {}
        reply = self._worker(function).call(event)
        error = "error" in reply
        if error:
            response_headers["x-amz-function-error"] = "Unhandled"
        payload = reply["error"] if error else reply["result"]
        self.invocations.append(Invocation(function.function_arn, event, payload, error))
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

