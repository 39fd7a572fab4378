"""`python -m lm.serving.server` (the image's `serve`): the SageMaker hosting server for an exported model.

gunicorn serves the WSGI app of `lm.serving.wsgi` with threaded workers: each worker runs one
generation at a time while its other threads keep answering `/ping` (SageMaker's health
check must not wait behind a long generation). The master never imports TensorFlow (it is
not fork-safe); each worker loads the model exported by `lm.serving.export` in a background thread,
so `/ping` answers 503 until it is loaded and warmed up, then 200. A model that cannot be
loaded stops the whole server with the reason in the log, instead of a container that never
gets healthy.

Settings (command-line flags win over the environment):

| setting | environment | default |
|---|---|---|
| model directory | `SM_MODEL_DIR` | `/opt/ml/model` |
| port | `SAGEMAKER_BIND_TO_PORT` | 8080 |
| workers | `SAGEMAKER_MODEL_SERVER_WORKERS` | 1 (each worker holds its own copy of the model) |
| threads per worker (requests in flight) | `LM_SERVE_THREADS` | 8 |
| request timeout, seconds | `SAGEMAKER_MODEL_SERVER_TIMEOUT` | 60 (longest wait for a generation slot, then 503; also gunicorn's hung-worker timeout) |
| limits per request | `LM_SERVE_MAX_PROMPT_TOKENS`, `LM_SERVE_MAX_NEW_TOKENS`, `LM_SERVE_MAX_INPUTS`, `LM_SERVE_MAX_BODY_BYTES` | see `lm.serving.wsgi.Limits` |
"""
import argparse
import logging
import os
import sys
import threading

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter

from lm.serving.wsgi import LIMIT_VARIABLES, Limits, ServingState, make_app, positive_int_env
from lm.spec import contract

log = logging.getLogger("lm.serving.server")

DEFAULT_MODEL_DIR = contract.MODEL_DIR  # where SageMaker hosting unpacks the endpoint's model.tar.gz
DEFAULT_PORT = 8080
DEFAULT_WORKERS = 1
DEFAULT_TIMEOUT = 60
DEFAULT_THREADS = 8


class ExportedModel:
    """The engine `lm.serving.wsgi` calls: the model `lm.serving.export` wrote, behind `lm.serving.generate.Generator`."""

    def __init__(self, model_dir):
        from lm.compat import tf
        from lm.serving.export import load_exported
        from lm.serving.generate import Generator

        # Several workers may share one GPU: let each take memory as it needs it.
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)
        model, config, tokenizer = load_exported(model_dir)
        self.generator = Generator(model, config, tokenizer)
        self.context_length = config.block_size
        self.vocab_size = config.vocab_size

    def count_tokens(self, text):
        return len(self.generator.encode(text))

    def generate(self, prompts, **parameters):
        return self.generator.generate(prompts, **parameters)


def load_into(state, model_dir, environ):
    """Load, warm up (the first generation traces the graphs), then mark the worker ready."""
    try:
        engine = ExportedModel(model_dir)
        limits = Limits.from_env(environ, engine.context_length)
        engine.generate(["warm up"], max_new_tokens=2, temperature=0.0)
    except Exception:
        log.exception("could not load the model from %s", model_dir)
        logging.shutdown()
        # gunicorn's arbiter halts the whole server when a worker exits with this code.
        os._exit(Arbiter.WORKER_BOOT_ERROR)
    state.ready(engine, limits)
    log.info("model from %s ready: context %d tokens, %s", model_dir, engine.context_length, dict(limits._asdict()))


class Server(BaseApplication):
    """gunicorn run in-process, configured from `options`; each worker builds its own app."""

    def __init__(self, options, model_dir, environ):
        self.options = options
        self.model_dir = model_dir
        self.environ = environ
        super().__init__()

    def load_config(self):
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self):
        state = ServingState()
        threading.Thread(target=load_into, args=(state, self.model_dir, self.environ),
                         name="model-loader", daemon=True).start()
        return make_app(state, request_timeout=self.options["timeout"])


def parse_args(argv, environ):
    parser = argparse.ArgumentParser(prog="serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default=environ.get("SM_MODEL_DIR") or DEFAULT_MODEL_DIR)
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=None, help="default: SAGEMAKER_BIND_TO_PORT or 8080")
    parser.add_argument("--workers", type=int, default=None, help="default: SAGEMAKER_MODEL_SERVER_WORKERS or 1")
    parser.add_argument("--timeout", type=int, default=None, help="default: SAGEMAKER_MODEL_SERVER_TIMEOUT or 60")
    parser.add_argument("--threads", type=int, default=None, help="default: LM_SERVE_THREADS or 8")
    # SageMaker starts the container as `docker run image serve`: accept that word.
    parser.add_argument("command", nargs="?", choices=["serve"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        port = args.port or positive_int_env(environ, "SAGEMAKER_BIND_TO_PORT", DEFAULT_PORT)
        workers = args.workers or positive_int_env(environ, "SAGEMAKER_MODEL_SERVER_WORKERS", DEFAULT_WORKERS)
        timeout = args.timeout or positive_int_env(environ, "SAGEMAKER_MODEL_SERVER_TIMEOUT", DEFAULT_TIMEOUT)
        threads = args.threads or positive_int_env(environ, "LM_SERVE_THREADS", DEFAULT_THREADS)
        for variable in LIMIT_VARIABLES.values():
            positive_int_env(environ, variable, 1)
        for name, value in (("--port", port), ("--workers", workers), ("--timeout", timeout), ("--threads", threads)):
            if value < 1 or (name == "--port" and value > 65535):
                raise ValueError("%s must be a positive integer%s, got %d"
                                 % (name, " up to 65535" if name == "--port" else "", value))
    except ValueError as error:
        parser.error(str(error))
    if not os.path.isdir(args.model_dir):
        parser.error("model directory %s does not exist (set SM_MODEL_DIR or --model-dir)" % args.model_dir)
    return args, gunicorn_options(args.host, port, workers, threads, timeout)


def gunicorn_options(host, port, workers, threads, timeout):
    return {
        "bind": "%s:%d" % (host, port),
        "workers": workers,
        "worker_class": "gthread",
        "threads": threads,
        "timeout": timeout,
        "graceful_timeout": timeout,
        "accesslog": "-",
        "errorlog": "-",
        "loglevel": "info",
        "proc_name": "lm.serving.server",
    }


def main(argv=None, environ=None):
    environ = os.environ if environ is None else environ
    args, options = parse_args(sys.argv[1:] if argv is None else argv, environ)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    Server(options, args.model_dir, environ).run()


if __name__ == "__main__":
    main()
