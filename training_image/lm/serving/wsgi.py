"""The inference server's WSGI application: the SageMaker hosting contract over HTTP.

`GET /ping` answers 200 once the model is loaded, 503 before. `POST /invocations` takes
`{"inputs": "prompt" | ["p1", ...], "parameters": {...}}` and answers
`[{"generated_text": ...}, ...]`, one entry per input. Every client mistake gets a 4xx with
a JSON error `{"error": {"code", "message", "field"}}` naming the problem; nothing a client
sends reaches the model unchecked, and an unexpected failure is a logged 500, never a dead
worker.

Imports no TensorFlow: the model sits behind a small engine interface (`context_length`,
`vocab_size`, `count_tokens(text)`, `generate(prompts, **parameters)`), so the master
process that forks the workers never touches TensorFlow. `lm.serving.server` runs this app under
gunicorn.
"""
import collections
import json
import logging
import threading
import time
from http import HTTPStatus

from lm.spec.fields import Field, range_message, type_message

log = logging.getLogger("lm.serving.server")

JSON_TYPE = "application/json"
DEFAULT_MAX_NEW_TOKENS = 64
MAX_TEMPERATURE = 100.0
MAX_SEED = 2 ** 31 - 1
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 256


class RequestError(Exception):
    """A client mistake: HTTP status, a stable code, a message, and the field at fault."""

    def __init__(self, status, code, message, field=None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field

    def body(self):
        error = collections.OrderedDict([("code", self.code), ("message", self.message)])
        if self.field is not None:
            error["field"] = self.field
        return {"error": error}


def _invalid(field, message):
    return RequestError(400, "invalid_request", "%s %s" % (field, message), field)


def _out_of_range(field, message):
    return RequestError(422, "out_of_range", "%s %s" % (field, message), field)


# ---- limits ----

# Environment variables of the server limits; each is a positive integer.
LIMIT_VARIABLES = collections.OrderedDict([
    ("max_prompt_tokens", "LM_SERVE_MAX_PROMPT_TOKENS"),
    ("max_new_tokens", "LM_SERVE_MAX_NEW_TOKENS"),
    ("max_inputs", "LM_SERVE_MAX_INPUTS"),
    ("max_body_bytes", "LM_SERVE_MAX_BODY_BYTES"),
])


class Limits(collections.namedtuple("Limits", list(LIMIT_VARIABLES))):
    """What one request may ask for. Prompt and new tokens together must fit the model's context."""

    @classmethod
    def from_env(cls, environ, context_length):
        """Defaults from the context length; each can be lowered (never raised past it) by its variable."""
        defaults = {
            "max_prompt_tokens": context_length - 1,
            "max_new_tokens": context_length - 1,
            "max_inputs": 16,
            "max_body_bytes": 1024 * 1024,
        }
        values = {}
        for name, variable in LIMIT_VARIABLES.items():
            value = positive_int_env(environ, variable, None)
            if value is None:
                values[name] = defaults[name]
                continue
            if name in ("max_prompt_tokens", "max_new_tokens") and value >= context_length:
                raise ValueError("%s must be below the model's context length %d, got %d"
                                 % (variable, context_length, value))
            values[name] = value
        return cls(**values)


def positive_int_env(environ, variable, default):
    """The environment variable as a positive integer, `default` when unset or empty."""
    raw = environ.get(variable)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError("%s must be a positive integer, got %r" % (variable, raw))
    return value


# ---- request parsing ----

def _integer(field, value, minimum, maximum):
    """An int (JSON 2.0 is refused here, unlike the job inputs): 400 for a wrong type, 422 out of range."""
    spec = Field(field, int, minimum=minimum, maximum=maximum)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(field, "%s, got %s" % (type_message(spec), json.dumps(value)))
    if not minimum <= value <= maximum:
        raise _out_of_range(field, "%s, got %d" % (range_message(spec), value))
    return value


def _number(field, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(field, "%s, got %s" % (type_message(Field(field, float)), json.dumps(value)))
    return float(value)


def _parse_max_new_tokens(value, limits, engine):
    return _integer("parameters.max_new_tokens", value, 1, limits.max_new_tokens)


def _parse_temperature(value, limits, engine):
    value = _number("parameters.temperature", value)
    if not 0.0 <= value <= MAX_TEMPERATURE:
        raise _out_of_range("parameters.temperature", "must be between 0 (greedy) and %g, got %g"
                            % (MAX_TEMPERATURE, value))
    return value


def _parse_top_k(value, limits, engine):
    return _integer("parameters.top_k", value, 0, engine.vocab_size)


def _parse_top_p(value, limits, engine):
    value = _number("parameters.top_p", value)
    if not 0.0 < value <= 1.0:
        raise _out_of_range("parameters.top_p", "must be in (0, 1], got %g" % value)
    return value


def _parse_seed(value, limits, engine):
    if value is None:
        return None
    return _integer("parameters.seed", value, 0, MAX_SEED)


def _parse_stop(value, limits, engine):
    if value is None:
        return None
    sequences = [value] if isinstance(value, str) else value
    if not isinstance(sequences, list):
        raise _invalid("parameters.stop", "must be a string or a list of strings, got %s" % json.dumps(value))
    if len(sequences) > MAX_STOP_SEQUENCES:
        raise _out_of_range("parameters.stop", "may hold at most %d sequences, got %d"
                            % (MAX_STOP_SEQUENCES, len(sequences)))
    for index, sequence in enumerate(sequences):
        field = "parameters.stop[%d]" % index if not isinstance(value, str) else "parameters.stop"
        if not isinstance(sequence, str):
            raise _invalid(field, "must be a string, got %s" % json.dumps(sequence))
        if not 1 <= len(sequence) <= MAX_STOP_CHARS:
            raise _out_of_range(field, "must be 1 to %d characters long, got %d" % (MAX_STOP_CHARS, len(sequence)))
    return sequences


# The generation parameters a request may set: name -> (parser, default).
PARAMETERS = collections.OrderedDict([
    ("max_new_tokens", (_parse_max_new_tokens, None)),
    ("temperature", (_parse_temperature, 1.0)),
    ("top_k", (_parse_top_k, 0)),
    ("top_p", (_parse_top_p, 1.0)),
    ("seed", (_parse_seed, None)),
    ("stop", (_parse_stop, None)),
])
REQUEST_FIELDS = ("inputs", "parameters")


def _reject_constant(name):
    raise ValueError("%s is not valid JSON" % name)


def decode_json(body):
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(400, "invalid_json", "the body is not valid UTF-8: %s" % error)
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as error:
        raise RequestError(400, "invalid_json", "the body is not valid JSON: %s" % error)


def parse_invocation(document, limits, engine):
    """Check a decoded request; return (prompts, generation parameters) or raise RequestError."""
    if not isinstance(document, dict):
        raise RequestError(400, "invalid_request", "the body must be a JSON object with \"inputs\", got %s"
                           % type(document).__name__)
    unknown = sorted(set(document) - set(REQUEST_FIELDS))
    if unknown:
        raise RequestError(400, "unknown_field", "unknown field %s; allowed: %s"
                           % (", ".join(unknown), ", ".join(REQUEST_FIELDS)), unknown[0])
    if "inputs" not in document:
        raise _invalid("inputs", "is required: a prompt string or a list of prompt strings")
    prompts = _parse_inputs(document["inputs"], limits)

    given = document.get("parameters", {})
    if not isinstance(given, dict):
        raise _invalid("parameters", "must be a JSON object, got %s" % json.dumps(given))
    unknown = sorted(set(given) - set(PARAMETERS))
    if unknown:
        raise RequestError(400, "unknown_field", "unknown field %s; allowed parameters: %s"
                           % (", ".join("parameters." + name for name in unknown), ", ".join(PARAMETERS)),
                           "parameters." + unknown[0])
    parameters = collections.OrderedDict()
    for name, (parse, default) in PARAMETERS.items():
        parameters[name] = parse(given[name], limits, engine) if name in given else default
    lengths = [engine.count_tokens(prompt) for prompt in prompts]
    if parameters["max_new_tokens"] is None:
        # Not asked for: as many as fit next to the longest prompt, up to the default.
        room = engine.context_length - max(lengths)
        parameters["max_new_tokens"] = max(1, min(DEFAULT_MAX_NEW_TOKENS, limits.max_new_tokens, room))
    for index, tokens in enumerate(lengths):
        _check_prompt_length(index, tokens, parameters["max_new_tokens"], limits, engine)
    return prompts, parameters


def _parse_inputs(value, limits):
    if isinstance(value, str):
        prompts, fields = [value], ["inputs"]
    elif isinstance(value, list):
        if not value:
            raise _out_of_range("inputs", "must hold at least one prompt")
        if len(value) > limits.max_inputs:
            raise _out_of_range("inputs", "may hold at most %d prompts (LM_SERVE_MAX_INPUTS), got %d"
                                % (limits.max_inputs, len(value)))
        prompts, fields = value, ["inputs[%d]" % index for index in range(len(value))]
    else:
        raise _invalid("inputs", "must be a string or a list of strings, got %s" % json.dumps(value))
    for field, prompt in zip(fields, prompts):
        if not isinstance(prompt, str):
            raise _invalid(field, "must be a string, got %s" % json.dumps(prompt))
    return list(prompts)


def _check_prompt_length(index, tokens, max_new_tokens, limits, engine):
    field = "inputs[%d]" % index
    if tokens < 1:
        raise _out_of_range(field, "is empty: a prompt needs at least one token")
    if tokens > limits.max_prompt_tokens:
        raise RequestError(422, "prompt_too_long", "%s is %d tokens; at most %d allowed (LM_SERVE_MAX_PROMPT_TOKENS)"
                           % (field, tokens, limits.max_prompt_tokens), field)
    if tokens + max_new_tokens > engine.context_length:
        raise RequestError(422, "prompt_too_long", "%s is %d tokens; with max_new_tokens=%d that exceeds the "
                           "model's context of %d tokens" % (field, tokens, max_new_tokens, engine.context_length),
                           field)


# ---- the app ----

class ServingState:
    """The model a worker serves, once its loader thread has put it there."""

    def __init__(self):
        self._loaded = threading.Event()
        self.engine = None
        self.limits = None

    def ready(self, engine, limits):
        self.engine, self.limits = engine, limits
        self._loaded.set()

    def current(self, wait_seconds=0.0):
        """(engine, limits), waiting up to `wait_seconds` for the load; (None, None) if not loaded yet."""
        if self._loaded.wait(wait_seconds):
            return self.engine, self.limits
        return None, None


def _content_type(environ):
    """(media type, charset) of the request, lower-cased; charset None when not given."""
    media, _, rest = environ.get("CONTENT_TYPE", "").partition(";")
    charset = None
    for parameter in rest.split(";"):
        key, _, value = parameter.strip().partition("=")
        if key.lower() == "charset":
            charset = value.strip().strip('"').lower()
    return media.strip().lower(), charset


def _accepts_json(environ):
    accept = environ.get("HTTP_ACCEPT", "")
    if not accept.strip():
        return True
    types = [item.split(";")[0].strip().lower() for item in accept.split(",")]
    return any(item in (JSON_TYPE, "application/*", "*/*") for item in types)


def _read_body(environ, limit):
    length = environ.get("CONTENT_LENGTH") or ""
    if length and int(length) > limit:
        raise RequestError(413, "body_too_large", "the body is %s bytes; at most %d allowed (LM_SERVE_MAX_BODY_BYTES)"
                           % (length, limit))
    body = environ["wsgi.input"].read(int(length) if length else limit + 1)
    if len(body) > limit:
        raise RequestError(413, "body_too_large", "the body is over %d bytes (LM_SERVE_MAX_BODY_BYTES)" % limit)
    return body


def _respond(start_response, status, document, headers=()):
    payload = json.dumps(document).encode("utf-8")
    start_response("%d %s" % (status, HTTPStatus(status).phrase),
                   [("Content-Type", JSON_TYPE), ("Content-Length", str(len(payload)))] + list(headers))
    return [payload]


ROUTES = {"/ping": "GET", "/invocations": "POST"}


def make_app(state, request_timeout=60.0):
    """The WSGI callable serving `state`'s model, for a threaded worker.

    One generation runs at a time per worker (a lock); `/ping` never waits for it, so the
    health check answers during long generations. An invocation waits up to `request_timeout`
    seconds for its turn (and, on a worker still loading, for the model: `/ping` speaks for
    its own worker, so with several workers the endpoint turns healthy when the first has
    loaded), else gets a 503.
    """
    generation = threading.Lock()

    def ping():
        engine, _ = state.current()
        if engine is None:
            return 503, {"status": "loading"}
        return 200, {"status": "ready", "context_length": engine.context_length}

    def invocations(environ):
        deadline = time.monotonic() + request_timeout
        engine, limits = state.current(request_timeout)
        if engine is None:
            return 503, RequestError(503, "loading", "the model is still loading; retry when /ping answers 200").body()
        media, charset = _content_type(environ)
        if media != JSON_TYPE or charset not in (None, "utf-8"):
            raise RequestError(415, "unsupported_media_type", "Content-Type must be %s (UTF-8), got %r"
                               % (JSON_TYPE, environ.get("CONTENT_TYPE", "")))
        if not _accepts_json(environ):
            raise RequestError(406, "not_acceptable", "this server answers %s only; Accept was %r"
                               % (JSON_TYPE, environ.get("HTTP_ACCEPT")))
        prompts, parameters = parse_invocation(decode_json(_read_body(environ, limits.max_body_bytes)), limits, engine)
        if not generation.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return 503, RequestError(503, "timeout", "no generation slot within the request timeout of %g s "
                                     "(SAGEMAKER_MODEL_SERVER_TIMEOUT); retry later" % request_timeout).body()
        try:
            texts = engine.generate(prompts, **parameters)
        finally:
            generation.release()
        return 200, [{"generated_text": text} for text in texts]

    def app(environ, start_response):
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        try:
            if path not in ROUTES:
                raise RequestError(404, "not_found", "no such path %r; this server has %s"
                                   % (path, ", ".join(sorted(ROUTES))))
            if method != ROUTES[path]:
                return _respond(start_response, 405, RequestError(
                    405, "method_not_allowed", "%s takes %s, got %s" % (path, ROUTES[path], method)).body(),
                    [("Allow", ROUTES[path])])
            status, document = ping() if path == "/ping" else invocations(environ)
            return _respond(start_response, status, document)
        except RequestError as error:
            return _respond(start_response, error.status, error.body())
        except Exception:
            log.exception("%s %s failed", method, path)
            return _respond(start_response, 500, RequestError(
                500, "internal_error", "the server failed to answer; see its log").body())

    return app
