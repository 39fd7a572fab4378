"""Every configuration lm.plan approves is one the runtime accepts (issue 16 item 8, in part).

Runs the plan over a grid of presets x instance types x counts x strategies x global batches,
then the runtime's own checks on each approved configuration: lm.data.TokenStream's split of the
global batch over the data-parallel ranks (on a real dataset), lm.job.validate_mp_parameters on
the plan's SMP parameters, and the shares the strategies cut from a worker's batch.
"""
import itertools

import pytest

from lm import instances, job, plan
from lm.data import TokenStream

PRESETS = ["gpt-125m", "gpt-1.3b"]
INSTANCE_TYPES = ["ml.p3.16xlarge", "ml.p4d.24xlarge", "ml.g5.12xlarge", "ml.g5.xlarge"]
COUNTS = [1, 2, 3, 10]
BATCHES = [8, 48, 100, 512]


def _runtime_data_parallel(strategy, verdict_plan, instance_count):
    """The data-parallel size lm.train hands TokenStream for this strategy."""
    if strategy == "mwms":
        return instance_count  # one TokenStream rank per worker; the worker splits over its GPUs
    return verdict_plan["data_parallel"]


def _approved():
    for preset, instance_type, count, strategy, batch in itertools.product(
            PRESETS, INSTANCE_TYPES, COUNTS, job.STRATEGIES, BATCHES):
        verdict = plan.check(preset, instance_type, count, strategy, global_batch=batch, recompute=True)
        if verdict.ok:
            yield preset, instance_type, count, strategy, batch, verdict.plan["chosen"]


def test_the_grid_approves_configurations_of_every_strategy():
    assert {approved[3] for approved in _approved()} == set(job.STRATEGIES)


def test_every_approved_configuration_passes_the_runtime_checks(text_dataset):
    disagreements = []
    for preset, instance_type, count, strategy, batch, chosen in _approved():
        where = "%s %d x %s %s global_batch=%d" % (preset, count, instance_type, strategy, batch)
        dp_size = _runtime_data_parallel(strategy, chosen, count)
        try:
            stream = TokenStream(text_dataset, "train", global_batch_size=batch, dp_rank=0, dp_size=dp_size)
        except ValueError as error:
            disagreements.append("%s: %s" % (where, error))
            continue
        if strategy == "mwms":
            gpus = instances.INSTANCES[instance_type].gpus
            if stream.batch_size % gpus:
                disagreements.append("%s: a worker's %d sequences do not split over %d GPUs"
                                     % (where, stream.batch_size, gpus))
        if strategy == "smp":
            parameters = job.validate_mp_parameters(dict(chosen["mp_parameters"]))
            if stream.batch_size % parameters["microbatches"]:
                disagreements.append("%s: %d sequences per replica, %d microbatches"
                                     % (where, stream.batch_size, parameters["microbatches"]))
            if chosen["data_parallel"] > 1 and parameters.get("horovod") is not True:
                disagreements.append("%s: %d model replicas need mp_parameters.horovod=true"
                                     % (where, chosen["data_parallel"]))
    assert not disagreements, "\n".join(disagreements)


@pytest.mark.parametrize("batch, suggestion", [(100, "use 96 or 112"), (8, None)])
def test_an_indivisible_global_batch_is_rejected_with_the_nearest_valid_ones(batch, suggestion):
    verdict = plan.check("gpt-125m", "ml.p3.16xlarge", 2, "horovod", global_batch=batch)
    assert not verdict.ok
    if suggestion:
        assert "not a multiple of the data-parallel size 16" in verdict.reason and suggestion in verdict.reason
    else:
        assert "smaller than the data-parallel size 16" in verdict.reason
