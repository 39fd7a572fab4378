"""Helpers of the server tests: a `tiny` model exported by `lm.serving.export.export_model`, and the real
server (`python -m lm.serving.server`, gunicorn) started on 127.0.0.1 in a subprocess."""
import os
import signal
import socket
import subprocess
import sys
import time

import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE = os.path.join(ROOT, "training_image")
STARTUP_LIMIT_S = 300
# What `lm.serving.server.load_into` logs when a worker's model is loaded and warmed up.
READY_LINE = " ready: context "


def tokenizer_texts():
    from pydoc_data.topics import topics

    return list(topics.values())


def export_tiny(out_dir, seed=0):
    """An untrained `tiny` GPT (seeded weights) and a BPE tokenizer trained on pydoc text."""
    from lm.compat import keras
    from controlplane.presets import get_preset
    from lm.serving.export import export_model
    from lm.models.gpt import build_model
    from lm.tokenizer import save, train_bpe

    config = get_preset("tiny")
    os.makedirs(out_dir, exist_ok=True)
    tokenizer_file = os.path.join(out_dir, "..", "tokenizer-source.json")
    save(train_bpe(tokenizer_texts(), vocab_size=config.vocab_size), tokenizer_file)
    keras.utils.set_random_seed(seed)
    export_model(build_model(config), config, tokenizer_file, out_dir)
    return out_dir


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`python -m lm.serving.server` on a free loopback port; its log goes to a file."""

    def __init__(self, model_dir, log_path, workers=1, env=None):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log_path = log_path
        environ = dict(os.environ, PYTHONPATH=os.pathsep.join([IMAGE, ROOT]), TF_CPP_MIN_LOG_LEVEL="2",
                       **(env or {}))
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lm.serving.server", "--host", "127.0.0.1", "--port", str(self.port),
             "--model-dir", model_dir, "--workers", str(workers)],
            env=environ, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self):
        with open(self.log_path) as handle:
            return handle.read()

    def wait_ready(self):
        """Poll /ping until 200; return the statuses seen before (a startup limit, not a timing check)."""
        seen = []
        deadline = time.monotonic() + STARTUP_LIMIT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError("server exited with %s:\n%s" % (self.process.returncode, self.log()))
            try:
                response = requests.get(self.url + "/ping", timeout=10)
            except requests.ConnectionError:
                time.sleep(0.05)
                continue
            if response.status_code == 200:
                return seen
            seen.append((response.status_code, response.json()))
            time.sleep(0.05)
        raise AssertionError("server not ready after %d s:\n%s" % (STARTUP_LIMIT_S, self.log()))

    def wait_workers_ready(self, workers):
        """Wait until every worker logged that its model is ready (each loads its own copy)."""
        deadline = time.monotonic() + STARTUP_LIMIT_S
        while self.log().count(READY_LINE) < workers:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("not all %d workers got ready:\n%s" % (workers, self.log()))
            time.sleep(0.1)

    def wait_exit(self):
        return self.process.wait(timeout=STARTUP_LIMIT_S)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def invoke(self, document, **kwargs):
        return requests.post(self.url + "/invocations", json=document, timeout=120, **kwargs)


# The limits the shared server runs with (all below the tiny model's context of 128 tokens).
LIMITS = {"LM_SERVE_MAX_PROMPT_TOKENS": "48", "LM_SERVE_MAX_NEW_TOKENS": "32", "LM_SERVE_MAX_INPUTS": "4",
          "LM_SERVE_MAX_BODY_BYTES": "4096"}
WORKERS = 2
