"""tf.distribute.MultiWorkerMirroredStrategy: one process per host, all its GPUs as replicas.

The cluster comes from TF_CONFIG. SageMaker's generic toolkit does not set it, so when it is
missing we build it from SM_HOSTS / SM_CURRENT_HOST, one worker per host on `LM_MWMS_PORT`;
`LM_HOST_ADDRESSES` (JSON {host: "address:port"}) overrides where each host is reached, so two
local "hosts" can be two ports on 127.0.0.1.

Every replica runs forward and backward on its share of this worker's batch inside
`strategy.run`, the gradients are averaged with the replica context's all-reduce, and the
optimizer updates each device's copy of the (mirrored) variables through `merge_call`. A
worker's batch must split evenly over its GPUs (`local_split_problem`, checked before each step
and by `lm.training.train --dry-run`). At a restart every worker resumes from the step the chief chooses
(a sum over the workers in which only the chief's value is not zero).
"""
import json
import os

from lm.compat import tf
from lm.distributed.base import Strategy, apply_update, compute_gradients, decode_step, encode_step

DEFAULT_PORT = 2222
MEAN = tf.distribute.ReduceOp.MEAN
SUM = tf.distribute.ReduceOp.SUM


def tf_config_from_sagemaker(environ):
    """TF_CONFIG for SM_HOSTS/SM_CURRENT_HOST, or None when those are not set."""
    if "SM_HOSTS" not in environ or "SM_CURRENT_HOST" not in environ:
        return None
    hosts = json.loads(environ["SM_HOSTS"])
    current = environ["SM_CURRENT_HOST"]
    if current not in hosts:
        raise ValueError("SM_CURRENT_HOST %r is not in SM_HOSTS %s" % (current, hosts))
    port = int(environ.get("LM_MWMS_PORT", DEFAULT_PORT))
    addresses = json.loads(environ.get("LM_HOST_ADDRESSES", "{}"))
    workers = [addresses.get(host, "%s:%d" % (host, port)) for host in hosts]
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": hosts.index(current)}}


def local_split_problem(worker_batch, workers, local_replicas):
    """Why a worker's `worker_batch` sequences cannot be split evenly over its `local_replicas` GPUs, or None."""
    if worker_batch % local_replicas:
        return ("a worker's %d sequences (global_batch_size / %d workers) do not split evenly over its %d GPUs"
                % (worker_batch, workers, local_replicas))
    return None


def worker_rank(tf_config):
    """(rank, number of workers) of this task; a "chief" task, if any, is rank 0."""
    cluster = tf_config.get("cluster", {})
    tasks = [("chief", i) for i in range(len(cluster.get("chief", [])))]
    tasks += [("worker", i) for i in range(len(cluster.get("worker", [])))]
    task = tf_config.get("task", {})
    return tasks.index((task.get("type"), task.get("index"))), len(tasks)


class MultiWorkerMirroredStrategy(Strategy):
    name = "mwms"

    def __init__(self):
        super().__init__()
        self.strategy = None
        self.local_replicas = 1
        self._reduce_value = self._sum_value = None

    def setup(self):
        if "TF_CONFIG" not in os.environ:
            built = tf_config_from_sagemaker(os.environ)
            if built is not None:
                os.environ["TF_CONFIG"] = json.dumps(built)
        tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
        self.rank, self.size = worker_rank(tf_config) if tf_config.get("cluster") else (0, 1)
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        self.local_replicas = self.strategy.num_replicas_in_sync // self.size
        self.local_size = 1
        strategy = self.strategy

        @tf.function(autograph=False)
        def reduce_value(value):
            return strategy.reduce(MEAN, strategy.run(tf.identity, args=(value,)), axis=None)

        @tf.function(autograph=False)
        def sum_value(value):
            return strategy.reduce(SUM, strategy.run(tf.identity, args=(value,)), axis=None)

        self._reduce_value, self._sum_value = reduce_value, sum_value
        return self

    @property
    def devices(self):
        return self.strategy.num_replicas_in_sync

    def scope(self):
        return self.strategy.scope()

    def _check_batch(self, inputs):
        problem = local_split_problem(inputs.shape[0], self.size, self.local_replicas)
        if problem:
            raise ValueError(problem)

    def _local_share(self, inputs, labels):
        """This replica's part of the worker's batch (the whole batch with one local device)."""
        if self.local_replicas == 1:
            return inputs, labels
        context = tf.distribute.get_replica_context()
        index = context.replica_id_in_sync_group % self.local_replicas
        share = tf.shape(inputs)[0] // self.local_replicas
        return inputs[index * share:(index + 1) * share], labels[index * share:(index + 1) * share]

    def build_train_step(self, model, optimizer, loss_fn, *, grad_clip=0.0, loss_scale=None, jit_compile=False):
        forward_backward = tf.function(
            lambda inputs, labels: compute_gradients(model, loss_fn, inputs, labels, loss_scale),
            jit_compile=jit_compile, autograph=False)

        def replica_step(inputs, labels):
            context = tf.distribute.get_replica_context()
            loss, grads = forward_backward(*self._local_share(inputs, labels))
            grads = context.all_reduce(MEAN, grads)
            loss = context.all_reduce(MEAN, loss)
            metrics = apply_update(optimizer, model.trainable_variables, grads, grad_clip, loss_scale, loss=loss)
            metrics["loss"] = loss
            return metrics

        @tf.function(autograph=False)
        def distributed_step(inputs, labels):
            metrics = self.strategy.run(replica_step, args=(inputs, labels))
            return {name: self.strategy.experimental_local_results(value)[0] for name, value in metrics.items()}

        def train_step(inputs, labels):
            self._check_batch(inputs)
            return distributed_step(inputs, labels)

        return train_step

    def build_eval_step(self, model, loss_fn, *, jit_compile=False):
        forward = tf.function(
            lambda inputs, labels: tf.cast(loss_fn(labels, model(inputs, training=False)), tf.float32),
            jit_compile=jit_compile, autograph=False)

        def replica_eval(inputs, labels):
            loss = forward(*self._local_share(inputs, labels))
            return tf.distribute.get_replica_context().all_reduce(MEAN, loss)

        @tf.function(autograph=False)
        def distributed_eval(inputs, labels):
            return self.strategy.experimental_local_results(self.strategy.run(replica_eval, args=(inputs, labels)))[0]

        def eval_step(inputs, labels):
            self._check_batch(inputs)
            return distributed_eval(inputs, labels)

        return eval_step

    def allreduce_mean(self, value):
        value = tf.convert_to_tensor(value, tf.float32)
        if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
            return tf.distribute.get_replica_context().all_reduce(MEAN, value)
        return self._reduce_value(value)

    def broadcast_restored_state(self, model, optimizer):
        """Mirrored variables stay equal by construction, but a rollback restores the chief's only (the other
        hosts lack its checkpoint mid-run): each variable becomes a sum to which only the chief's first
        replica contributes, which is exact (in float64: the optimizer's int64 step too)."""
        strategy, chief = self.strategy, self.is_chief

        def chief_value(value):
            first = tf.distribute.get_replica_context().replica_id_in_sync_group == 0
            return tf.where(tf.logical_and(tf.constant(chief), first), value, tf.zeros_like(value))

        for variable in list(model.variables) + optimizer.variables:
            value = tf.cast(variable.read_value(), tf.float64)
            total = strategy.reduce(SUM, strategy.run(chief_value, args=(value,)), axis=None)
            variable.assign(tf.cast(total, variable.dtype))

    def broadcast_step(self, step):
        # Every local replica of a worker contributes the worker's value.
        total = self._sum_value(tf.constant(encode_step(step) if self.is_chief else 0.0, tf.float32))
        return decode_step(float(total) / self.local_replicas)

    def barrier(self):
        self.allreduce_mean(0.0)
