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

A spot interruption as it reaches the training processes on SageMaker: the toolkit does not
forward SIGTERM to them and MPI workers are killed without a save, so once the chief logged step
`interrupt_at` and a periodic checkpoint is on its disk (the writer runs beside training, so the
first one can land a few steps after its step) every process of every host (the toolkit and what
it started) gets SIGKILL at once, and nothing saves. The job is then started again on fresh trees (a new instance keeps
nothing but what the checkpoint sync brings back) and resumes from the last periodic
checkpoint to the end; the steps trained after that checkpoint are lost, and reported.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import psutil

from lm import checkpoint
from lm.spec import job
from lmstack.demo_run import POLL_SECONDS, StepError, TRAINING_IMAGE, bar, environment, tail

SAGEMAKER_ROOT = "/opt/ml/"
STEP = re.compile(r"\bstep=(\d+)\b")
RESUMED = re.compile(r"resumed from (\S+) at step (\d+)")
RUN_TIMEOUT_SECONDS = 600


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
                          LM_HOST_ADDRESSES=json.dumps(addresses), LM_CHECKPOINT_DIR=checkpoints,
                          TRAINING_JOB_NAME=request["TrainingJobName"])  # as SageMaker sets it in the container
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen([sys.executable, "-m", "sagemaker_training.cli.train"], cwd=self.base,
                                        env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self):
        with open(self.log_path, errors="replace") as handle:
            return handle.read()

    def processes(self):
        """The toolkit process and every process under it (empty once it ended)."""
        try:
            root = psutil.Process(self.process.pid)
            return root.children(recursive=True) + [root]
        except psutil.NoSuchProcess:
            return []

    def stop(self):
        """Kill the toolkit and what it started, if still running (after a failure); close the log."""
        if self.process is None:
            return
        if self.process.poll() is None:
            kill(self.processes())
            self.process.wait()
        self._log.close()


def kill(processes):
    """SIGKILL to each of `processes`, skipping those already gone."""
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def last_step(text):
    steps = [int(match.group(1)) for line in text.splitlines() if job.TRAIN_LOG_PREFIX in line
             for match in [STEP.search(line)] if match]
    return steps[-1] if steps else 0


def _failed(hosts, why):
    return StepError("%s\n%s" % (why, "\n".join("--- %s (%s):\n%s" % (host.name, host.log_path, tail(host.log_path))
                                                for host in hosts)))


def run_phase(request, hosts, phase, max_steps, kill_at=None, first_step=0, can_kill=lambda: True):
    """Start every host and wait for all; with `kill_at`, once the chief logged that step and
    `can_kill()` holds, SIGKILL to every process of every host at once (collected first, so none
    outlives the others).

    Returns (each host's log, the last step the chief had logged when it was killed, or None).
    StepError when a host fails, or when a run to be killed ends before `kill_at`.
    """
    addresses = {host.name: "127.0.0.1:%d" % port for host, port in zip(hosts, free_ports(len(hosts)))}
    for host in hosts:
        host.start(request, addresses)
    chief = hosts[0]
    killed = False
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    try:
        with bar("%s: %d hosts, steps" % (phase, len(hosts)), total=max_steps, unit="step") as progress:
            progress.update(first_step)
            while any(host.process.poll() is None for host in hosts):
                step = last_step(chief.log())
                progress.update(max(0, step - progress.n))
                if kill_at is not None and step >= kill_at and can_kill():
                    kill([process for host in hosts for process in host.processes()])
                    killed = True
                    progress.set_postfix_str("SIGKILL at step %d" % step)
                    break
                if any(host.process.poll() not in (None, 0) for host in hosts):
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
    if kill_at is not None:
        if not killed:
            raise _failed(hosts, "%s ended before the chief logged step %d (interrupt_at)" % (phase, kill_at))
        return logs, last_step(logs[chief.name])
    statuses = {host.name: host.process.returncode for host in hosts}
    if any(statuses.values()):
        raise _failed(hosts, "%s: the toolkit exited with %s" % (phase, statuses))
    return logs, None


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
    """Run the job, kill it at `interrupt_at`, run it again from its checkpoints; what happened."""
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

    def checkpoint_on_disk(host):
        directory = local(host)
        return os.path.isdir(directory) and any(map(checkpoint.PATTERN.match, os.listdir(directory)))

    first = make_hosts("attempt-1")
    started = time.monotonic()
    logs_1, killed_step = run_phase(request, first, "attempt 1 (killed)", max_steps, kill_at=interrupt_at,
                                    can_kill=lambda: checkpoint_on_disk(first[0]))
    billed = [time.monotonic() - started]  # what SageMaker would bill per instance: the hosts' time
    uploaded = upload_checkpoints(first, local, remote)
    saved = [int(match.group(1)) for match in map(checkpoint.PATTERN.match, uploaded) if match]
    if not saved:
        raise _failed(first, "no periodic checkpoint was complete when the hosts were killed at step %d (lower "
                             "checkpoint_every or raise interrupt_at)" % killed_step)
    resume_step = max(saved)
    print("  checkpoint sync: %s -> %s (%s)" % (request["CheckpointConfig"]["LocalPath"],
                                               request["CheckpointConfig"]["S3Uri"], ", ".join(uploaded)))

    second = make_hosts("attempt-2")
    download_checkpoints(second, local, remote)
    started = time.monotonic()
    logs_2, _ = run_phase(request, second, "attempt 2 (resumed)", max_steps, first_step=resume_step)
    billed.append(time.monotonic() - started)
    resumed = RESUMED.search(logs_2[second[0].name])
    if not resumed or int(resumed.group(2)) != resume_step:
        raise _failed(second, "the second attempt did not resume from the last checkpoint, step %d" % resume_step)
    upload_checkpoints(second, local, remote)
    model_dir = os.path.join(second[0].base, "model")
    if not os.path.exists(os.path.join(model_dir, "model.json")):
        raise _failed(second, "the chief exported no model to %s" % model_dir)
    return {
        "hosts": [host.name for host in second],
        "killed_step": killed_step,
        "resume_step": resume_step,
        # At least: steps run after the last [train] line the chief wrote are lost too.
        "lost_steps": killed_step - resume_step,
        "max_steps": max_steps,
        "billed_seconds": billed,
        "checkpoints": remote,
        "synced_checkpoints": sorted(os.listdir(remote)),
        "model_dir": model_dir,
        "logs": [first[0].log_path, second[0].log_path] + [host.log_path for host in first[1:] + second[1:]],
        "chief_logs": [logs_1[first[0].name], logs_2[second[0].name]],
    }
