"""The real server (gunicorn, 2 workers) on 127.0.0.1 with a `tiny` model from `lm.serving.export`."""
import concurrent.futures
import json
import random
import time

import pytest
import requests

from serving import LIMITS, WORKERS, Server

PROMPTS = ["The quick brown fox", "def main():", "In the beginning", "import os"]


def generated(response):
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/json"
    body = response.json()
    assert isinstance(body, list) and all(set(item) == {"generated_text"} for item in body)
    return [item["generated_text"] for item in body]


def booted_workers(server):
    return server.log().count("Booting worker with pid")


def test_ping_answers_503_while_loading_then_200(server):
    assert server.startup, "the first /ping answered before the model was loaded"
    assert all(seen == (503, {"status": "loading"}) for seen in server.startup)
    response = requests.get(server.url + "/ping", timeout=10)
    assert response.status_code == 200 and response.json()["status"] == "ready"
    assert booted_workers(server) == WORKERS


def test_single_prompt(server):
    [text] = generated(server.invoke({"inputs": "Hello", "parameters": {"max_new_tokens": 8, "seed": 1}}))
    assert isinstance(text, str) and text


def test_batch_answers_per_input_and_matches_one_by_one(server):
    parameters = {"max_new_tokens": 12, "temperature": 0}
    batch = generated(server.invoke({"inputs": PROMPTS, "parameters": parameters}))
    assert len(batch) == len(PROMPTS)
    alone = [generated(server.invoke({"inputs": prompt, "parameters": parameters}))[0] for prompt in PROMPTS]
    assert batch == alone
    assert len(set(batch)) > 1


def test_same_seed_same_text_on_every_worker(server):
    request = {"inputs": ["Once upon a time", "x = 1"], "parameters": {"max_new_tokens": 16, "temperature": 1.0,
                                                                       "top_k": 50, "top_p": 0.9, "seed": 7}}
    # Sync workers take one request each at a time: sent together, they land on both workers.
    with concurrent.futures.ThreadPoolExecutor(WORKERS * 2) as pool:
        answers = list(pool.map(lambda _: generated(server.invoke(request)), range(WORKERS * 2)))
    assert all(answer == answers[0] for answer in answers)
    other = dict(request, parameters=dict(request["parameters"], seed=8))
    assert generated(server.invoke(other)) != answers[0]


def test_greedy_needs_no_seed(server):
    request = {"inputs": "Greedy decoding", "parameters": {"temperature": 0, "max_new_tokens": 10}}
    assert generated(server.invoke(request)) == generated(server.invoke(request))


def test_served_tokens_equal_full_recomputation(server, tiny_model_dir):
    """The server generates with the KV cache; the reference recomputes every prefix in-process."""
    from lm.serving.export import load_exported
    from lm.serving.generate import Generator

    model, config, tokenizer = load_exported(tiny_model_dir)
    reference = Generator(model, config, tokenizer)
    for parameters in ({"temperature": 0, "max_new_tokens": 20}, {"temperature": 0.8, "seed": 3, "max_new_tokens": 20}):
        served = generated(server.invoke({"inputs": PROMPTS[:3], "parameters": parameters}))
        assert served == reference.generate(PROMPTS[:3], use_cache=False, **parameters)


def test_stop_sequence_cuts_the_text(server):
    parameters = {"temperature": 0, "max_new_tokens": 24}
    [full] = generated(server.invoke({"inputs": "Stop here", "parameters": parameters}))
    assert len(full) >= 8, full
    stop = full[4:7]
    [cut] = generated(server.invoke({"inputs": "Stop here", "parameters": dict(parameters, stop=[stop])}))
    assert cut == full[:full.find(stop)]


def test_empty_prompt_starts_a_new_document(server):
    [text] = generated(server.invoke({"inputs": "", "parameters": {"max_new_tokens": 4, "seed": 0}}))
    assert isinstance(text, str)


def _json(document):
    return json.dumps(document).encode("utf-8")


JSON = {"Content-Type": "application/json"}
TOO_LONG_PROMPT = "word " * 200
MALFORMED = [
    # (case, method, path, headers, body, status, code, field)
    ("truncated JSON", "POST", "/invocations", JSON, b'{"inputs": ', 400, "invalid_json", None),
    ("not UTF-8", "POST", "/invocations", JSON, b'{"inputs": "\xff\xfe"}', 400, "invalid_json", None),
    ("NaN", "POST", "/invocations", JSON, b'{"inputs": "a", "parameters": {"temperature": NaN}}', 400,
     "invalid_json", None),
    ("text/plain", "POST", "/invocations", {"Content-Type": "text/plain"}, _json({"inputs": "a"}), 415,
     "unsupported_media_type", None),
    ("no content type", "POST", "/invocations", {}, _json({"inputs": "a"}), 415, "unsupported_media_type", None),
    ("latin-1 charset", "POST", "/invocations", {"Content-Type": "application/json; charset=latin-1"},
     _json({"inputs": "a"}), 415, "unsupported_media_type", None),
    ("Accept text/csv", "POST", "/invocations", dict(JSON, Accept="text/csv"), _json({"inputs": "a"}), 406,
     "not_acceptable", None),
    ("body is a list", "POST", "/invocations", JSON, _json(["a"]), 400, "invalid_request", None),
    ("no inputs", "POST", "/invocations", JSON, _json({"parameters": {}}), 400, "invalid_request", "inputs"),
    ("unknown field", "POST", "/invocations", JSON, _json({"inputs": "a", "prompt": "b"}), 400, "unknown_field",
     "prompt"),
    ("unknown parameter", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": {"max_tokens": 5}}),
     400, "unknown_field", "parameters.max_tokens"),
    ("inputs a number", "POST", "/invocations", JSON, _json({"inputs": 5}), 400, "invalid_request", "inputs"),
    ("input not a string", "POST", "/invocations", JSON, _json({"inputs": ["a", 3]}), 400, "invalid_request",
     "inputs[1]"),
    ("no prompts", "POST", "/invocations", JSON, _json({"inputs": []}), 422, "out_of_range", "inputs"),
    ("too many prompts", "POST", "/invocations", JSON, _json({"inputs": ["a"] * 5}), 422, "out_of_range", "inputs"),
    ("parameters a list", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": [1]}), 400,
     "invalid_request", "parameters"),
    ("max_new_tokens a string", "POST", "/invocations", JSON,
     _json({"inputs": "a", "parameters": {"max_new_tokens": "5"}}), 400, "invalid_request", "parameters.max_new_tokens"),
    ("max_new_tokens a bool", "POST", "/invocations", JSON,
     _json({"inputs": "a", "parameters": {"max_new_tokens": True}}), 400, "invalid_request",
     "parameters.max_new_tokens"),
    ("max_new_tokens fractional", "POST", "/invocations", JSON,
     _json({"inputs": "a", "parameters": {"max_new_tokens": 2.5}}), 400, "invalid_request",
     "parameters.max_new_tokens"),
    ("max_new_tokens 0", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": {"max_new_tokens": 0}}),
     422, "out_of_range", "parameters.max_new_tokens"),
    ("max_new_tokens over the limit", "POST", "/invocations", JSON,
     _json({"inputs": "a", "parameters": {"max_new_tokens": int(LIMITS["LM_SERVE_MAX_NEW_TOKENS"]) + 1}}), 422,
     "out_of_range", "parameters.max_new_tokens"),
    ("temperature negative", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": {"temperature": -1}}),
     422, "out_of_range", "parameters.temperature"),
    ("temperature infinite", "POST", "/invocations", JSON, b'{"inputs": "a", "parameters": {"temperature": 1e400}}',
     422, "out_of_range", "parameters.temperature"),
    ("temperature a word", "POST", "/invocations", JSON,
     _json({"inputs": "a", "parameters": {"temperature": "hot"}}), 400, "invalid_request", "parameters.temperature"),
    ("top_k negative", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": {"top_k": -1}}), 422,
     "out_of_range", "parameters.top_k"),
    ("top_k over the vocabulary", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": {"top_k": 513}}),
     422, "out_of_range", "parameters.top_k"),
    ("top_p 0", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": {"top_p": 0}}), 422,
     "out_of_range", "parameters.top_p"),
    ("top_p over 1", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": {"top_p": 1.5}}), 422,
     "out_of_range", "parameters.top_p"),
    ("seed negative", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": {"seed": -1}}), 422,
     "out_of_range", "parameters.seed"),
    ("seed a string", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": {"seed": "x"}}), 400,
     "invalid_request", "parameters.seed"),
    ("stop a number", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": {"stop": 5}}), 400,
     "invalid_request", "parameters.stop"),
    ("stop empty", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": {"stop": ["ok", ""]}}), 422,
     "out_of_range", "parameters.stop[1]"),
    ("too many stops", "POST", "/invocations", JSON, _json({"inputs": "a", "parameters": {"stop": ["s"] * 17}}),
     422, "out_of_range", "parameters.stop"),
    ("prompt too long", "POST", "/invocations", JSON, _json({"inputs": ["ok", TOO_LONG_PROMPT[:2000]]}), 422,
     "prompt_too_long", "inputs[1]"),
    ("body too large", "POST", "/invocations", JSON, _json({"inputs": "a" * 5000}), 413, "body_too_large", None),
    ("GET /invocations", "GET", "/invocations", {}, b"", 405, "method_not_allowed", None),
    ("POST /ping", "POST", "/ping", JSON, b"{}", 405, "method_not_allowed", None),
    ("unknown path", "GET", "/predict", {}, b"", 404, "not_found", None),
]


@pytest.mark.parametrize("case, method, path, headers, body, status, code, field", MALFORMED,
                         ids=[case[0] for case in MALFORMED])
def test_malformed_request_gets_a_json_4xx_naming_the_problem(server, case, method, path, headers, body, status,
                                                             code, field):
    response = requests.request(method, server.url + path, headers=headers, data=body, timeout=60)
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    assert error.get("field") == field
    if field:
        assert field in error["message"]
    if status == 405:
        assert response.headers["Allow"] in ("GET", "POST")


def test_no_worker_died_on_the_bad_requests(server):
    for case in MALFORMED:
        requests.request(case[1], server.url + case[2], headers=case[3], data=case[4], timeout=60)
    assert generated(server.invoke({"inputs": "still alive", "parameters": {"max_new_tokens": 4}}))
    log = server.log()
    assert booted_workers(server) == WORKERS, log
    assert "Traceback" not in log and "exited with code" not in log


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


@pytest.mark.slow
def test_load_200_requests_16_concurrent_no_5xx(server):
    rng = random.Random(0)
    requests_to_send = []
    for index in range(200):
        if index % 10 == 9:  # some clients get it wrong; they must not disturb the others
            requests_to_send.append(({"inputs": "a", "parameters": {"top_p": 2}}, 422))
        else:
            inputs = rng.choice(PROMPTS) if index % 2 else rng.sample(PROMPTS, rng.randint(1, 3))
            requests_to_send.append(({"inputs": inputs, "parameters": {"max_new_tokens": rng.randint(4, 12),
                                                                       "seed": index}}, 200))

    for index in range(0, 200, 20):  # health checks among the invocations: answered, not queued behind them
        requests_to_send.insert(index, (None, 200))

    def send(item):
        document, expected = item
        started = time.perf_counter()
        if document is None:
            response = requests.get(server.url + "/ping", timeout=300)
        else:
            response = requests.post(server.url + "/invocations", json=document, timeout=300)
        return response.status_code, expected, time.perf_counter() - started

    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(send, requests_to_send))
    wall = time.perf_counter() - began
    pings = [latency for (document, _), (_, _, latency) in zip(requests_to_send, results) if document is None]
    latencies = [latency for (document, _), (_, expected, latency) in zip(requests_to_send, results)
                 if expected == 200 and document is not None]
    print("\nload: %d invocations + %d pings, 16 concurrent, %d workers, %.1f s, %.1f req/s; invocation latency "
          "ms p50 %.0f p90 %.0f p99 %.0f; slowest ping %.0f ms"
          % (len(results) - len(pings), len(pings), WORKERS, wall, len(results) / wall,
             1000 * percentile(latencies, 0.5), 1000 * percentile(latencies, 0.9), 1000 * percentile(latencies, 0.99),
             1000 * max(pings)))
    assert [status for status, _, _ in results if status >= 500] == []
    assert [(status, expected) for status, expected, _ in results if status != expected] == []
    assert booted_workers(server) == WORKERS


def test_a_directory_without_an_export_stops_the_server(tmp_path):
    empty = tmp_path / "model"
    empty.mkdir()
    server = Server(str(empty), str(tmp_path / "server.log"))
    try:
        code = server.wait_exit()
    finally:
        server.stop()
    assert code != 0
    log = server.log()
    assert "could not load the model from %s" % empty in log
    assert "model.json: not found" in log
