"""The WSGI app and the server settings in-process, with a FAKE engine (no model, no TF):
the loading state and the settings that cannot be watched from outside the real server.
The real server is tested in test_server.py."""
import io
import json
import threading

import pytest

from lm.serving import server, wsgi


class FakeEngine:
    """A fake of `lm.serving.server.ExportedModel`: one token per character, echoes the prompt reversed."""

    context_length = 64
    vocab_size = 100

    def __init__(self, fail=False):
        self.fail = fail
        self.calls = []

    def count_tokens(self, text):
        return len(text)

    def generate(self, prompts, **parameters):
        self.calls.append((prompts, parameters))
        if self.fail:
            raise RuntimeError("engine broke")
        return [prompt[::-1] for prompt in prompts]


def call(app, method, path, body=b"", content_type="application/json"):
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "CONTENT_TYPE": content_type,
               "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
    seen = {}

    def start_response(status, headers):
        seen["status"], seen["headers"] = int(status.split()[0]), dict(headers)

    payload = b"".join(app(environ, start_response))
    assert seen["headers"]["Content-Type"] == "application/json"
    assert int(seen["headers"]["Content-Length"]) == len(payload)
    return seen["status"], json.loads(payload.decode("utf-8"))


def test_ping_and_invocations_answer_503_until_the_model_is_ready():
    state = wsgi.ServingState()
    app = wsgi.make_app(state, request_timeout=0.1)
    assert call(app, "GET", "/ping") == (503, {"status": "loading"})
    status, body = call(app, "POST", "/invocations", b'{"inputs": "abc"}')
    assert status == 503 and body["error"]["code"] == "loading"

    engine = FakeEngine()
    state.ready(engine, wsgi.Limits.from_env({}, engine.context_length))
    assert call(app, "GET", "/ping") == (200, {"status": "ready", "context_length": 64})
    assert call(app, "POST", "/invocations", b'{"inputs": "abc"}') == (200, [{"generated_text": "cba"}])


def test_an_invocation_on_a_loading_worker_waits_for_its_model():
    state = wsgi.ServingState()
    engine = FakeEngine()
    loader = threading.Timer(0.2, state.ready, (engine, wsgi.Limits.from_env({}, engine.context_length)))
    loader.start()
    try:
        assert call(wsgi.make_app(state, request_timeout=60), "POST", "/invocations",
                    b'{"inputs": "abc"}') == (200, [{"generated_text": "cba"}])
    finally:
        loader.join()


class BlockingEngine(FakeEngine):
    """A fake engine whose generation waits until the test releases it."""

    def __init__(self):
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def generate(self, prompts, **parameters):
        self.entered.set()
        assert self.release.wait(60), "the test never released the generation"
        return super().generate(prompts, **parameters)


def test_ping_answers_during_a_generation_and_a_second_one_waits_its_turn_or_times_out():
    engine = BlockingEngine()
    state = wsgi.ServingState()
    state.ready(engine, wsgi.Limits.from_env({}, engine.context_length))
    app = wsgi.make_app(state, request_timeout=0.2)
    results = []
    first = threading.Thread(target=lambda: results.append(call(app, "POST", "/invocations", b'{"inputs": "ab"}')))
    first.start()
    try:
        assert engine.entered.wait(60)
        assert call(app, "GET", "/ping")[0] == 200
        status, body = call(app, "POST", "/invocations", b'{"inputs": "cd"}')
        assert status == 503 and body["error"]["code"] == "timeout"
        assert "SAGEMAKER_MODEL_SERVER_TIMEOUT" in body["error"]["message"]
    finally:
        engine.release.set()
        first.join()
    assert results == [(200, [{"generated_text": "ba"}])]
    assert [prompts for prompts, _ in engine.calls] == [["ab"]]


def test_defaults_reach_the_engine():
    engine = FakeEngine()
    state = wsgi.ServingState()
    state.ready(engine, wsgi.Limits.from_env({"LM_SERVE_MAX_NEW_TOKENS": "10"}, engine.context_length))
    call(wsgi.make_app(state), "POST", "/invocations", b'{"inputs": ["ab", "cd"], "parameters": {"stop": "x"}}')
    assert engine.calls == [(["ab", "cd"], {"max_new_tokens": 10, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                                            "seed": None, "stop": ["x"]})]


def test_an_engine_failure_is_a_500_and_the_app_keeps_serving():
    engine = FakeEngine(fail=True)
    state = wsgi.ServingState()
    state.ready(engine, wsgi.Limits.from_env({}, engine.context_length))
    app = wsgi.make_app(state)
    status, body = call(app, "POST", "/invocations", b'{"inputs": "abc"}')
    assert status == 500 and body["error"]["code"] == "internal_error"
    engine.fail = False
    assert call(app, "POST", "/invocations", b'{"inputs": "abc"}')[0] == 200


@pytest.mark.parametrize("variable, value, message", [
    ("LM_SERVE_MAX_NEW_TOKENS", "many", "LM_SERVE_MAX_NEW_TOKENS must be a positive integer"),
    ("LM_SERVE_MAX_INPUTS", "0", "LM_SERVE_MAX_INPUTS must be a positive integer"),
    ("LM_SERVE_MAX_PROMPT_TOKENS", "64", "below the model's context length 64"),
])
def test_limit_variables_are_checked(variable, value, message):
    with pytest.raises(ValueError, match=message):
        wsgi.Limits.from_env({variable: value}, 64)


def test_limits_default_to_the_context():
    assert wsgi.Limits.from_env({}, 128) == wsgi.Limits(127, 127, 16, 1024 * 1024)


def test_server_settings_come_from_the_sagemaker_variables(tmp_path):
    environ = {"SM_MODEL_DIR": str(tmp_path), "SAGEMAKER_BIND_TO_PORT": "9001",
               "SAGEMAKER_MODEL_SERVER_WORKERS": "3", "SAGEMAKER_MODEL_SERVER_TIMEOUT": "120"}
    args, options = server.parse_args(["serve"], environ)
    assert args.model_dir == str(tmp_path)
    assert options["bind"] == "0.0.0.0:9001"
    assert (options["workers"], options["timeout"], options["worker_class"], options["threads"]) == (
        3, 120, "gthread", 8)
    args, options = server.parse_args(["--port", "8555", "--workers", "1", "--host", "127.0.0.1"],
                                     dict(environ, LM_SERVE_THREADS="4"))
    assert (options["bind"], options["workers"], options["threads"]) == ("127.0.0.1:8555", 1, 4)


def test_server_defaults_are_the_sagemaker_contract(tmp_path):
    _, options = server.parse_args(["--model-dir", str(tmp_path)], {})
    assert options["bind"] == "0.0.0.0:8080"
    assert (options["workers"], options["timeout"]) == (1, 60)


@pytest.mark.parametrize("environ, message", [
    ({"SAGEMAKER_MODEL_SERVER_WORKERS": "lots"}, "SAGEMAKER_MODEL_SERVER_WORKERS must be a positive integer"),
    ({"SAGEMAKER_MODEL_SERVER_TIMEOUT": "-5"}, "SAGEMAKER_MODEL_SERVER_TIMEOUT must be a positive integer"),
    ({"LM_SERVE_MAX_INPUTS": "x"}, "LM_SERVE_MAX_INPUTS must be a positive integer"),
    ({"LM_SERVE_THREADS": "0"}, "LM_SERVE_THREADS must be a positive integer"),
    ({"SM_MODEL_DIR": "/nonexistent/model"}, "/nonexistent/model does not exist"),
])
def test_bad_server_settings_stop_before_starting(tmp_path, capsys, environ, message):
    environ = dict({"SM_MODEL_DIR": str(tmp_path)}, **environ)
    with pytest.raises(SystemExit) as exited:
        server.parse_args([], environ)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
