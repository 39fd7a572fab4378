"""One process, one device (or the CPU): the defaults of `Strategy`, unchanged."""
from lm.distributed.base import Strategy


class SingleStrategy(Strategy):
    name = "single"
