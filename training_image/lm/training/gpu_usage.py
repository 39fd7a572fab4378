"""Per-GPU utilization in the job's log, for the low-GPU alarm (`stacks.monitoring`).

SageMaker's own `GPUUtilization` (namespace /aws/sagemaker/TrainingJobs, one series per host)
is summed over the host's GPUs: 0-800 % on an 8-GPU host. One alarm threshold then means 20 % of
the only GPU of an ml.g5.2xlarge but 2.5 % per GPU of an ml.p4d.24xlarge, and a host with seven
idle GPUs out of eight still reads "busy". So the first process on each host prints the mean over
its GPUs every INTERVAL_SECONDS (`[gpu] utilization_per_gpu=... gpus=...`), a line the job's
metric definition `gpu:utilization_per_gpu` (`controlplane.metrics.METRIC_DEFINITIONS`) turns into a per-host
metric, the same 0-100 scale on every instance type.

Pure Python 3.8, no TensorFlow; reads `nvidia-smi`, which the GPU images carry. A host without it
(CPU instances, tests) reports nothing.
"""
import os
import shutil
import subprocess
import sys
import threading
import time

QUERY = ("nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits")
INTERVAL_SECONDS = 60
# mpirun's local rank (horovod, smddp, smp); the strategies without MPI run one process per host.
LOCAL_RANK_VARIABLE = "OMPI_COMM_WORLD_LOCAL_RANK"


def parse(output):
    """The per-GPU percentages of `nvidia-smi --query-gpu=utilization.gpu` output (one line per GPU)."""
    return [float(line) for line in output.splitlines() if line.strip()]


def log_line(percentages):
    return "[gpu] utilization_per_gpu=%.1f gpus=%d" % (sum(percentages) / len(percentages), len(percentages))


def read(run=subprocess.run):
    """Each GPU's utilization now, or None when nvidia-smi cannot tell."""
    try:
        result = run(QUERY, capture_output=True, text=True, timeout=30)
        percentages = parse(result.stdout) if result.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return percentages or None


def report(out=None, reader=read):
    """Print one line for this host; False when there was nothing to report."""
    percentages = reader()
    if not percentages:
        return False
    print(log_line(percentages), file=out or sys.stdout, flush=True)
    return True


def start(environ=os.environ, interval=INTERVAL_SECONDS):
    """A daemon thread reporting every `interval` seconds, on the first process of a host with
    nvidia-smi; None elsewhere. It ends with the process."""
    if environ.get(LOCAL_RANK_VARIABLE, "0") != "0" or shutil.which(QUERY[0]) is None:
        return None
    def loop():
        while report():
            time.sleep(interval)

    thread = threading.Thread(target=loop, name="gpu-usage", daemon=True)
    thread.start()
    return thread
