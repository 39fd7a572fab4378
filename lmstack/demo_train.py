"""Demo step: the training job of a CreateTrainingJob request, run by the real SageMaker
training toolkit (`sagemaker-training`) on this machine, one local "host" per instance.

Each host gets an `/opt/ml`-shaped tree, as SageMaker gives each instance:

    <host>/input/config/hyperparameters.json   the request's HyperParameters, as sent
    <host>/input/config/resourceconfig.json    current_host, hosts (algo-1 .. algo-N)
    <host>/input/config/inputdataconfig.json   the request's channels
    <host>/input/data/<channel>                -> the local dataset (the EFS mount on AWS)
    <host>/code                                train.py and lm/ (baked into the image on AWS)
    <host>/checkpoints, <host>/model, <host>/output

and the toolkit runs `train.py` there (SAGEMAKER_BASE_DIR; SM_STUDIO_LOCAL_MODE skips its DNS
wait for the hosts). The hosts reach each other on 127.0.0.1 ports (`LM_HOST_ADDRESSES`, read
by `lm.distributed.mwms`). SageMaker's checkpoint sync (LocalPath <-> S3Uri) is simulated with
a local directory standing for the S3 prefix: after a run every host's checkpoints are
uploaded there, before a run they are downloaded to every host.

A spot interruption: SIGTERM to every host's training process once the chief logged step
`interrupt_at`; each must save a checkpoint and exit 0 within GRACE_SECONDS (else it is killed,
as SageMaker would, and the step fails). The job is then started again on
fresh trees (a new instance keeps nothing but what the checkpoint sync brings back) and
resumes from the checkpoint to the end.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil

from lm import checkpoint, job
from lmstack.demo_run import POLL_SECONDS, StepError, TRAINING_IMAGE, bar, environment, tail

SAGEMAKER_ROOT = "/opt/ml/"
STEP = re.compile(r"\bstep=(\d+)\b")
SIGTERM_SAVED = re.compile(r"SIGTERM: saved a checkpoint at step (\d+)")
RESUMED = re.compile(r"resumed from (\S+) at step (\d+)")
RUN_TIMEOUT_SECONDS = 600
GRACE_SECONDS = 60  # SageMaker gives 120 s between its spot warning and the kill


def decoded_hyperparameters(request):
    return {name: job.decode_hyperparameter(value) for name, value in request["HyperParameters"].items()}


def hosts_of(request):
    return ["algo-%d" % index for index in range(1, request["ResourceConfig"]["InstanceCount"] + 1)]


def local_path(base, sagemaker_path):
    """Where a path under /opt/ml of the container lies in a host's tree."""
    if not sagemaker_path.startswith(SAGEMAKER_ROOT):
        raise StepError("%s is not under %s" % (sagemaker_path, SAGEMAKER_ROOT))
    return os.path.join(base, sagemaker_path[len(SAGEMAKER_ROOT):])


def s3_path(s3_root, uri):
    """The local directory standing for an S3 prefix: <s3_root>/<bucket>/<key>."""
    if not uri.startswith("s3://"):
        raise StepError("CheckpointConfig.S3Uri %r is not an s3:// URI" % uri)
    return os.path.join(s3_root, uri[len("s3://"):].rstrip("/"))


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def build_tree(base, host, request, channel_dirs):
    """One host's /opt/ml tree for `request`; `channel_dirs`: channel name -> local directory."""
    if os.path.exists(base):
        shutil.rmtree(base)
    config = os.path.join(base, "input", "config")
    os.makedirs(config)
    with open(os.path.join(config, "hyperparameters.json"), "w") as handle:
        json.dump(request["HyperParameters"], handle, indent=2)
    with open(os.path.join(config, "resourceconfig.json"), "w") as handle:
        json.dump({"current_host": host, "hosts": hosts_of(request), "network_interface_name": "lo"}, handle)
    channels = {}
    for channel in request["InputDataConfig"]:
        name = channel["ChannelName"]
        if name not in channel_dirs:
            raise StepError("the request has channel %r; the demo has data for %s" % (name, ", ".join(channel_dirs)))
        channels[name] = {"TrainingInputMode": channel["InputMode"]}
        data = os.path.join(base, "input", "data")
        os.makedirs(data, exist_ok=True)
        os.symlink(os.path.abspath(channel_dirs[name]), os.path.join(data, name))
    with open(os.path.join(config, "inputdataconfig.json"), "w") as handle:
        json.dump(channels, handle, indent=2)
    code = os.path.join(base, "code")
    shutil.copytree(os.path.join(TRAINING_IMAGE, "lm"), os.path.join(code, "lm"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    program = decoded_hyperparameters(request)["sagemaker_program"]
    shutil.copy(os.path.join(TRAINING_IMAGE, program), os.path.join(code, program))
    for name in ("model", "output", "checkpoints"):
        os.makedirs(os.path.join(base, name), exist_ok=True)
    return base


class Host:
    """One local instance: its tree and the toolkit process running the job there."""

    def __init__(self, name, base, log_path):
        self.name, self.base, self.log_path = name, base, log_path
        self.process = None

    def start(self, request, addresses):
        program = decoded_hyperparameters(request)["sagemaker_program"]
        checkpoints = local_path(self.base, request["CheckpointConfig"]["LocalPath"])
        env = environment(SAGEMAKER_BASE_DIR=self.base, SAGEMAKER_PROGRAM=program,
                          SAGEMAKER_SUBMIT_DIRECTORY=os.path.join(self.base, "code"), SM_STUDIO_LOCAL_MODE="true",
                          LM_HOST_ADDRESSES=json.dumps(addresses), LM_CHECKPOINT_DIR=checkpoints)
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen([sys.executable, "-m", "sagemaker_training.cli.train"], cwd=self.base,
                                        env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def program_process(self, program):
        """The training program the toolkit started (None before it started or after it ended)."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return None
        for child in children:
            try:
                if any(part.endswith(program) for part in child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        return None

    def log(self):
        with open(self.log_path, errors="replace") as handle:
            return handle.read()

    def stop(self):
        """Kill the toolkit and what it started, if still running (after a failure); close the log."""
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                children = psutil.Process(self.process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                children = []
            for process in children + [self.process]:
                try:
                    process.kill()
                except psutil.NoSuchProcess:
                    pass
            self.process.wait()
        self._log.close()


def last_step(text):
    steps = [int(match.group(1)) for line in text.splitlines() if job.TRAIN_LOG_PREFIX in line
             for match in [STEP.search(line)] if match]
    return steps[-1] if steps else 0


def _failed(hosts, why):
    return StepError("%s\n%s" % (why, "\n".join("--- %s (%s):\n%s" % (host.name, host.log_path, tail(host.log_path))
                                                for host in hosts)))


def _signal_programs(hosts, program, signum):
    targets = [host.program_process(program) for host in hosts]
    for target in targets:
        if target is not None:
            try:
                target.send_signal(signum)
            except psutil.NoSuchProcess:
                pass
    return targets


def run_phase(request, hosts, phase, max_steps, interrupt_at=None, first_step=0):
    """Start every host and wait for all; with `interrupt_at`, a spot interruption once the
    chief logged that step: SIGTERM to every training process, and SIGKILL to those still
    running GRACE_SECONDS later.

    Returns (each host's log, the step SIGTERM was sent at). StepError when a host fails, or
    when an interrupted run does not report a checkpoint and exit 0 within the grace period.
    """
    program = decoded_hyperparameters(request)["sagemaker_program"]
    addresses = {host.name: "127.0.0.1:%d" % port for host, port in zip(hosts, free_ports(len(hosts)))}
    for host in hosts:
        host.start(request, addresses)
    chief = hosts[0]
    signalled_at = signal_step = None
    killed = False
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    try:
        with bar("%s: %d hosts, steps" % (phase, len(hosts)), total=max_steps, unit="step") as progress:
            progress.update(first_step)
            while any(host.process.poll() is None for host in hosts):
                step = last_step(chief.log())
                progress.update(max(0, step - progress.n))
                if interrupt_at is not None and signalled_at is None and step >= interrupt_at:
                    if None in _signal_programs(hosts, program, signal.SIGTERM):
                        raise _failed(hosts, "a host's training process was gone before the interruption")
                    signalled_at, signal_step = time.monotonic(), step
                    progress.set_postfix_str("SIGTERM at step %d" % step)
                if signalled_at is not None and not killed and time.monotonic() - signalled_at > GRACE_SECONDS:
                    _signal_programs(hosts, program, signal.SIGKILL)
                    killed = True
                    progress.set_postfix_str("SIGKILL after %d s" % GRACE_SECONDS)
                if not killed and any(host.process.poll() not in (None, 0) for host in hosts):
                    break
                if time.monotonic() > deadline:
                    raise _failed(hosts, "%s ran past %d s" % (phase, RUN_TIMEOUT_SECONDS))
                time.sleep(POLL_SECONDS)
            progress.update(max(0, last_step(chief.log()) - progress.n))
            for host in hosts:
                host.process.wait(timeout=RUN_TIMEOUT_SECONDS)
    finally:
        for host in hosts:
            host.stop()
    logs = {host.name: host.log() for host in hosts}
    if killed:
        raise _failed(hosts, "%s: the training processes did not checkpoint and exit within %d s of SIGTERM and "
                             "were killed, as SageMaker kills them after its warning (the steps since the last "
                             "periodic checkpoint are lost)" % (phase, GRACE_SECONDS))
    statuses = {host.name: host.process.returncode for host in hosts}
    if any(statuses.values()):
        raise _failed(hosts, "%s: the toolkit exited with %s" % (phase, statuses))
    if interrupt_at is None:
        return logs, None
    if signalled_at is None:
        raise _failed(hosts, "%s ended before the chief logged step %d (interrupt_at)" % (phase, interrupt_at))
    if not SIGTERM_SAVED.search(logs[chief.name]):
        raise _failed(hosts, "%s ran to its end without reporting a checkpoint after SIGTERM at step %d"
                             % (phase, signal_step))
    return logs, signal_step


def upload_checkpoints(hosts, local, remote):
    """SageMaker's checkpoint sync, upload: every host's LocalPath files to the S3 prefix."""
    os.makedirs(remote, exist_ok=True)
    for host in hosts:
        directory = local(host)
        for name in sorted(os.listdir(directory)):
            shutil.copy2(os.path.join(directory, name), os.path.join(remote, name))
    return sorted(os.listdir(remote))


def download_checkpoints(hosts, local, remote):
    """... and download: the S3 prefix to every host's LocalPath before the job starts."""
    for host in hosts:
        for name in sorted(os.listdir(remote)):
            shutil.copy2(os.path.join(remote, name), os.path.join(local(host), name))


def train(request, channel_dirs, out_dir, interrupt_at):
    """Run the job with one spot interruption at `interrupt_at`; a summary of what happened."""
    out_dir = os.path.abspath(out_dir)  # the toolkit runs in each host's tree
    hp = decoded_hyperparameters(request)
    max_steps = hp["max_steps"]
    if not 0 < interrupt_at < max_steps:
        raise StepError("interrupt_at must be between 1 and max_steps - 1 (%d), got %d" % (max_steps - 1, interrupt_at))
    remote = s3_path(os.path.join(out_dir, "s3"), request["CheckpointConfig"]["S3Uri"])
    if os.path.exists(remote):
        shutil.rmtree(remote)
    logs_dir = os.path.join(out_dir, "logs")
    os.makedirs(logs_dir, exist_ok=True)

    def make_hosts(attempt):
        hosts = []
        for name in hosts_of(request):
            base = build_tree(os.path.join(out_dir, "hosts", attempt, name), name, request, channel_dirs)
            hosts.append(Host(name, base, os.path.join(logs_dir, "train-%s-%s.log" % (attempt, name))))
        return hosts

    def local(host):
        return local_path(host.base, request["CheckpointConfig"]["LocalPath"])

    first = make_hosts("attempt-1")
    logs_1, signal_step = run_phase(request, first, "attempt 1 (interrupted)", max_steps, interrupt_at=interrupt_at)
    stop_step = int(SIGTERM_SAVED.search(logs_1[first[0].name]).group(1))
    uploaded = upload_checkpoints(first, local, remote)
    if checkpoint.checkpoint_name(stop_step) not in uploaded:
        raise _failed(first, "no checkpoint of step %d among the synced checkpoints %s" % (stop_step, uploaded))
    print("  checkpoint sync: %s -> %s (%s)" % (request["CheckpointConfig"]["LocalPath"],
                                               request["CheckpointConfig"]["S3Uri"], ", ".join(uploaded)))

    second = make_hosts("attempt-2")
    download_checkpoints(second, local, remote)
    logs_2, _ = run_phase(request, second, "attempt 2 (resumed)", max_steps, first_step=stop_step)
    resumed = RESUMED.search(logs_2[second[0].name])
    if not resumed or int(resumed.group(2)) != stop_step:
        raise _failed(second, "the second attempt did not resume from step %d" % stop_step)
    upload_checkpoints(second, local, remote)
    model_dir = os.path.join(second[0].base, "model")
    if not os.path.exists(os.path.join(model_dir, "model.json")):
        raise _failed(second, "the chief exported no model to %s" % model_dir)
    return {
        "hosts": [host.name for host in second],
        "stop_step": stop_step,
        "signal_step": signal_step,
        "max_steps": max_steps,
        "checkpoints": remote,
        "synced_checkpoints": sorted(os.listdir(remote)),
        "model_dir": model_dir,
        "logs": [first[0].log_path, second[0].log_path] + [host.log_path for host in first[1:] + second[1:]],
        "chief_logs": [logs_1[first[0].name], logs_2[second[0].name]],
    }
