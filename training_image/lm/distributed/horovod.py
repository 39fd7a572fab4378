"""Horovod: one process per GPU, gradients averaged with Horovod's all-reduce.

The seed's six steps: `hvd.init()`, pin one GPU per process by local rank, scale the
learning rate with the data-parallel size (`lm.training.optim.scaled_learning_rate` scales with the
global batch), average the gradients (`hvd.grouped_allreduce(op=Average)`, what
`hvd.DistributedGradientTape` does inside), broadcast weights and optimizer state from rank 0
after the first step, checkpoint on rank 0 only (and resume from the step rank 0 chooses,
`hvd.broadcast`). Works over MPI (SageMaker's `mpi`
distribution) and over Gloo (`horovodrun --gloo`, our tests).
"""
from lm.compat import tf
from lm.distributed.base import Strategy, decode_step, encode_step, pin_gpu


class HorovodStrategy(Strategy):
    name = "horovod"

    def __init__(self):
        super().__init__()
        self.hvd = None

    def setup(self):
        import horovod.tensorflow as hvd

        hvd.init()
        self.hvd = hvd
        self.take_ranks_from(hvd)
        pin_gpu(self.local_rank)
        return self

    def reduce_gradients(self, grads):
        return self.hvd.grouped_allreduce(list(grads), op=self.hvd.Average)

    def allreduce_mean(self, value):
        return self.hvd.allreduce(tf.convert_to_tensor(value, tf.float32), op=self.hvd.Average)

    def broadcast_initial_state(self, model, optimizer):
        self.hvd.broadcast_variables(list(model.variables) + optimizer.variables, root_rank=0)

    def broadcast_step(self, step):
        return decode_step(self.hvd.broadcast(tf.constant(encode_step(step), tf.float32), root_rank=0))

    def barrier(self):
        self.allreduce_mean(0.0)

    def shutdown(self):
        self.hvd.shutdown()
