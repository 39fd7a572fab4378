"""TensorBoard scalars of a training run, written by rank 0 with `tf.summary`.

Under SageMaker the directory is `/opt/ml/output/tensorboard` (`lm.spec.contract`), which SageMaker
uploads to the request's `TensorBoardOutputConfig.S3OutputPath` while the job runs; point
TensorBoard at that S3 prefix (or at a local copy) to watch it. On a laptop nothing is written
unless `lm.training.train --tensorboard-dir DIR` asks for it.

Tags: train/loss, train/learning_rate, train/grad_norm, train/tokens_per_s, train/mfu,
train/loss_scale, validation/loss, divergence/skipped_steps, divergence/rollbacks, and goodput/<total> for each
of lm.spec.job.GOODPUT_TOTALS at every save and at the end; the step is the global training step.
"""
import os

from lm.spec import contract, job

# tensorflow/core/framework/summary.proto: enum DataClass { ..., DATA_CLASS_SCALAR = 1, ... }
DATA_CLASS_SCALAR = 1
TRAIN_TAGS = ("loss", "learning_rate", "grad_norm", "tokens_per_s", "mfu", "loss_scale")


def default_directory(under_sagemaker, environ=None):
    """Where summaries go when no directory is given: SageMaker's TensorBoard path (under
    SAGEMAKER_BASE_DIR in a local /opt/ml tree), or None (not written) outside SageMaker."""
    environ = os.environ if environ is None else environ
    if not under_sagemaker:
        return None
    base = environ.get("SAGEMAKER_BASE_DIR")
    if base:
        return os.path.join(base, os.path.relpath(contract.TENSORBOARD_LOCAL_PATH, "/opt/ml"))
    return contract.TENSORBOARD_LOCAL_PATH


def scalar_metadata(tf):
    """What `tf.summary.scalar` attaches, built here: from TF 2.16 on `tf.summary.scalar` needs the
    tensorboard package, which TensorFlow no longer installs (TensorBoard's scalars plugin reads
    plugin name "scalars", empty content = version 0, data class scalar)."""
    metadata = tf.compat.v1.SummaryMetadata(plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"))
    if "data_class" in metadata.DESCRIPTOR.fields_by_name:  # not in every TF's proto
        metadata.data_class = DATA_CLASS_SCALAR
    return metadata


def _refuse_unknown(what, names, allowed):
    unknown = sorted(set(names) - set(allowed))
    if unknown:
        raise ValueError("unknown %s %s; allowed: %s" % (what, ", ".join(unknown), ", ".join(allowed)))


class Summaries:
    """Scalars to `directory` when this process writes them (`enabled`: rank 0), else nothing; and
    to `tracker` (`lm.training.tracking.Tracker`, rank 0's MLflow run) when there is one."""

    def __init__(self, directory, enabled, tracker=None):
        self._writer = None
        self._tracker = tracker
        if directory and enabled:
            from lm.compat import tf

            os.makedirs(directory, exist_ok=True)
            self._tf = tf
            self._writer = tf.summary.create_file_writer(directory)
            self._metadata = scalar_metadata(tf)

    def _write(self, step, prefix, values):
        if self._tracker is not None:
            self._tracker.metrics(step, prefix, values)
        if self._writer is None:
            return
        with self._writer.as_default():
            for name, value in values.items():
                self._tf.summary.write("%s/%s" % (prefix, name), self._tf.constant(float(value), self._tf.float32),
                                       step=int(step), metadata=self._metadata)
        # SageMaker uploads what is on disk: flush at every log line, not every two minutes.
        self._writer.flush()

    def train(self, step, **values):
        """One log window's values; names from TRAIN_TAGS."""
        _refuse_unknown("training summaries", values, TRAIN_TAGS)
        self._write(step, "train", values)

    def divergence(self, step, skipped_steps, rollbacks):
        """The run's counts of skipped steps and rollbacks (lm.training.divergence), at each one."""
        self._write(step, "divergence", {"skipped_steps": skipped_steps, "rollbacks": rollbacks})

    def validation(self, step, loss):
        self._write(step, "validation", {"loss": loss})

    def goodput(self, step, totals):
        """The goodput ledger's totals (lm.training.goodput, names from lm.spec.job.GOODPUT_TOTALS) at a save and
        at the end: the job's side of the bill (the dollars need SageMaker's billable time, after the job)."""
        _refuse_unknown("goodput totals", totals, job.GOODPUT_TOTALS)
        self._write(step, "goodput", totals)

    def close(self):
        if self._tracker is not None:
            self._tracker.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
