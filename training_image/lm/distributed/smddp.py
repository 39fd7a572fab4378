"""SageMaker distributed data parallel (SMDDP), TF 2.11 image: one process per GPU.

The library's six documented steps: `sdp.init()`; pin GPU `sdp.local_rank()`; scale the
learning rate by `sdp.size()` (lm.training.train does it from `data_parallel_size`); wrap the tape in
`sdp.DistributedGradientTape` (with `sparse_as_dense=True`, documented from the v1.1.x API page
on, SageMaker Python SDK pull request #2346; without it the library's handling of
`tf.IndexedSlices` is undocumented); `sdp.broadcast_variables` of model and optimizer state from
rank 0 after the first step; checkpoints and export on rank 0 only, and at a restart every rank
resumes from the step rank 0 chooses (`sdp.broadcast(tensor, root_rank)`). SMDDP does not support
Keras `model.fit`, which is why the loop is a plain GradientTape step.
"""
from lm.compat import tf
from lm.distributed.base import Strategy, apply_update, decode_step, encode_step, pin_gpu


class SMDDPStrategy(Strategy):
    name = "smddp"

    def __init__(self):
        super().__init__()
        self._sdp = None

    def setup(self):
        import smdistributed.dataparallel.tensorflow as sdp

        sdp.init()
        self._sdp = sdp
        self.take_ranks_from(sdp)
        pin_gpu(self.local_rank)
        return self

    def allreduce_mean(self, value):
        # Not `allreduce`: the TensorFlow API page reserves it for gradients ("use oob_allreduce
        # for any other tensor ... otherwise the job might stall or stop"). The loss, the eval
        # loss, the stop vote, the checkpoint clock and the restore check come here.
        return self._sdp.oob_allreduce(tf.convert_to_tensor(value, tf.float32))

    def build_train_step(self, model, optimizer, loss_fn, *, grad_clip=0.0, loss_scale=None, jit_compile=False):
        # The tape wraps a call of the (XLA-compiled) forward function, so the backward pass is
        # compiled too while the all-reduce that DistributedGradientTape adds stays outside XLA.
        variables = model.trainable_variables
        forward = tf.function(
            lambda inputs, labels: tf.cast(loss_fn(labels, model(inputs, training=True)), tf.float32),
            jit_compile=jit_compile)

        @tf.function
        def train_step(inputs, labels):
            with tf.GradientTape() as tape:
                loss = forward(inputs, labels)
                scaled = loss_scale.scale(loss) if loss_scale is not None else loss
            # The position table's gradient (a gather) is a tf.IndexedSlices, which AdamW cannot
            # take; sparse_as_dense has the tape make it a tensor before the dense all-reduce.
            grads = self._sdp.DistributedGradientTape(tape, sparse_as_dense=True).gradient(scaled, variables)
            if loss_scale is not None:
                grads = loss_scale.unscale(grads)
            loss = self.allreduce_mean(loss)
            metrics = apply_update(optimizer, variables, grads, grad_clip, loss_scale, loss=loss)
            metrics["loss"] = loss
            return metrics

        return train_step

    def broadcast_initial_state(self, model, optimizer):
        self._sdp.broadcast_variables(model.variables, root_rank=0)
        self._sdp.broadcast_variables(optimizer.variables, root_rank=0)

    def broadcast_step(self, step):
        return decode_step(self._sdp.broadcast(tf.constant(encode_step(step), tf.float32), root_rank=0))

    def barrier(self):
        # SMDDP documents no barrier; an all-reduce returns only when every rank has joined it
        # (oob_allreduce: the tensor is not a gradient).
        self._sdp.oob_allreduce(tf.constant(0.0)).numpy()

    def shutdown(self):
        self._sdp.shutdown()
