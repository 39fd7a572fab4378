"""lm.training.gpu_usage: the per-GPU utilization line the low-GPU alarm reads (SageMaker's GPUUtilization sums a host's GPUs)."""
import io
import subprocess

from controlplane import metrics as log_metrics
from lm.training import gpu_usage
from stacks.monitoring import LOW_GPU_UTILIZATION_PERCENT


def _nvidia_smi(stdout, returncode=0):
    return lambda *args, **kwargs: subprocess.CompletedProcess(gpu_usage.QUERY, returncode, stdout, "")


def test_eight_gpus_at_ten_percent_read_ten_per_gpu_and_fire_the_alarm():
    out = io.StringIO()
    assert gpu_usage.report(out, reader=lambda: gpu_usage.read(_nvidia_smi("10\n" * 8)))
    line = out.getvalue().strip()
    assert line == "[gpu] utilization_per_gpu=10.0 gpus=8"
    assert log_metrics.parse_metrics(line) == {"gpu:utilization_per_gpu": 10.0}
    assert 10.0 < LOW_GPU_UTILIZATION_PERCENT < 10 * 8  # SageMaker's summed GPUUtilization would read 80


def test_one_busy_gpu_of_eight_still_reads_idle():
    assert gpu_usage.log_line(gpu_usage.parse("100\n0\n0\n0\n0\n0\n0\n0\n")) == \
        "[gpu] utilization_per_gpu=12.5 gpus=8"


def test_nothing_is_reported_without_nvidia_smi_or_on_the_other_ranks_of_a_host():
    out = io.StringIO()
    assert gpu_usage.read(_nvidia_smi("", returncode=9)) is None
    assert not gpu_usage.report(out, reader=lambda: None) and out.getvalue() == ""
    assert gpu_usage.start({gpu_usage.LOCAL_RANK_VARIABLE: "3"}) is None
