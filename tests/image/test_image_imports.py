"""Every module the training image runs imports, as the Dockerfile's last step imports them there:
the entry points (train.py, prepare.py; bin/serve is lm.serving.server's) and every module of lm, the
strategy adapters and the server among them (a strategy's library loads in its setup only)."""
import importlib
import os
import pkgutil
import sys

import pytest

IMAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "training_image")


@pytest.mark.tf26
def test_every_module_the_image_runs_imports(monkeypatch):
    monkeypatch.syspath_prepend(IMAGE)
    import lm
    modules = ["train", "prepare"] + [module.name for module in pkgutil.walk_packages(lm.__path__, "lm.")]
    for name in modules:
        importlib.import_module(name)
    assert {"lm.distributed.smp", "lm.serving.server", "lm.training.train"} <= set(sys.modules)
    with open(os.path.join(IMAGE, "bin", "serve")) as handle:
        assert "from lm.serving.server import main" in handle.read()
