"""Fixtures of the server tests: the exported `tiny` model and one shared real server."""
import pytest

from serving import LIMITS, WORKERS, Server, export_tiny


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return export_tiny(str(tmp_path_factory.mktemp("serve") / "model"))


@pytest.fixture(scope="session")
def server(tiny_model_dir, tmp_path_factory):
    started = Server(tiny_model_dir, str(tmp_path_factory.mktemp("serve-log") / "server.log"), workers=WORKERS,
                     env=dict(LIMITS, SAGEMAKER_MODEL_SERVER_TIMEOUT="120"))
    try:
        started.startup = started.wait_ready()
        started.wait_workers_ready(WORKERS)
        yield started
    finally:
        started.stop()
