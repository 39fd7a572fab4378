"""The SMP strategy's training with 2 model replicas of 2 partitions and with 1, as thread ranks of the
FAKE smdistributed.modelparallel (tests/fakes; not AWS's library) and its fake Horovod, for
test_smp_replicas.py. It runs in a subprocess because the fake's `hvd.allreduce` inside a
tf.function holds one TensorFlow inter-op thread per rank, and the test process keeps one.

    python replicas_job.py DATASET OUT

writes to OUT a pickle of three runs, each a list of per-rank entries: "replicas" (4 ranks, 2
replicas, horovod true, 3 steps), "reference" (2 ranks, 1 replica, 3 steps) and "local_mean" (the
replicas for 1 step with the strategy's `_dp_mean` returning the local value: a broken runtime,
which the test must tell apart). Each entry holds the rank's ranks (SMP and Horovod) and, per step,
its input rows, the loss and the values of the variables it holds (by index in the whole model's
weights) after the update (step 1: before the broadcast of the initial state).
"""
import json
import os
import pickle
import sys

MP = {"partitions": 2, "microbatches": 2, "auto_partition": False, "default_partition": 0}
STEPS, GLOBAL_BATCH = 3, 8


def train_rank(dataset, steps=STEPS):
    from lm.data.dataset import TokenStream
    from lm.distributed import get_strategy
    from lm.distributed.smp import weight_paths
    from lm.training.optim import AdamW
    from smdist_helpers import build_tiny, sequence_loss
    strategy = get_strategy("smp").setup()
    model = strategy.build_model(build_tiny)
    with strategy.scope():
        optimizer = AdamW(model.trainable_variables, lambda step: 1e-2, epsilon=1e-4)
    train_step = strategy.build_train_step(model, optimizer, sequence_loss, grad_clip=1.0)
    held = weight_paths(model)  # this rank's partition, by layer path
    stream = TokenStream(dataset, "train", global_batch_size=GLOBAL_BATCH, dp_rank=strategy.data_parallel_rank,
                         dp_size=strategy.data_parallel_size, seed=1234)
    batches = stream.batches()
    trained = []
    for step in range(steps):
        inputs, labels = next(batches)
        metrics = train_step(inputs, labels)
        trained.append({"rows": inputs.numpy(), "loss": float(metrics["loss"]),
                      "weights": {path: weight.numpy() for path, weight in held.items()}})
        if step == 0:
            strategy.broadcast_initial_state(model, optimizer)
    hvd = strategy._hvd
    return {"rank": strategy.rank, "mp_rank": strategy.mp_rank, "dp_rank": strategy.data_parallel_rank,
            "hvd": None if hvd is None else (hvd.rank(), hvd.size()), "steps": trained}


def main(argv):
    dataset, out = argv
    import smdistributed.modelparallel.tensorflow as smp
    from lm.distributed.smp import SMPStrategy
    runs = {}
    os.environ["SM_HP_MP_PARAMETERS"] = json.dumps(dict(MP, horovod=True))
    runs["replicas"] = smp.run_ranks(4, train_rank, dataset)
    dp_mean = SMPStrategy._dp_mean
    SMPStrategy._dp_mean = lambda self, value: value
    try:
        runs["local_mean"] = smp.run_ranks(4, train_rank, dataset, 1)
    finally:
        SMPStrategy._dp_mean = dp_mean
    os.environ["SM_HP_MP_PARAMETERS"] = json.dumps(MP)
    runs["reference"] = smp.run_ranks(2, train_rank, dataset)
    with open(out, "wb") as handle:
        pickle.dump(runs, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
