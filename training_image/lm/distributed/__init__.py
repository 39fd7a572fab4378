"""Distribution strategies behind one interface (`lm.distributed.base.Strategy`).

Each adapter lives in its own module and imports its library only when used, so the
Horovod, SMDDP and SMP images need nothing they do not ship.
"""
import importlib

from lm.spec.job import STRATEGIES

# strategy name -> (module, class); each class subclasses lm.distributed.base.Strategy.
ADAPTERS = {
    "single": ("lm.distributed.single", "SingleStrategy"),
    "mwms": ("lm.distributed.mwms", "MultiWorkerMirroredStrategy"),
    "horovod": ("lm.distributed.horovod", "HorovodStrategy"),
    "smddp": ("lm.distributed.smddp", "SMDDPStrategy"),
    "smp": ("lm.distributed.smp", "SMPStrategy"),
}
assert set(ADAPTERS) == set(STRATEGIES), "every strategy in lm.spec.job.STRATEGIES needs an adapter"


def get_strategy(name, **options):
    """A new, not yet set-up adapter for strategy `name` (one of lm.spec.job.STRATEGIES)."""
    if name not in ADAPTERS:
        raise ValueError("strategy must be one of %s, got %r" % (", ".join(STRATEGIES), name))
    module_name, class_name = ADAPTERS[name]
    return getattr(importlib.import_module(module_name), class_name)(**options)
