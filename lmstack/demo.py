"""`make demo` (`python -m lmstack.demo`): the whole pipeline on this machine, no AWS.

1. corpus: a small Pile-format corpus (`lmstack.sample_corpus`);
2. prepare: `lm.data.prepare` with a byte-level BPE trained on it, sized for the preset;
3. state machine: the deployed definition executed on moto's engine with the demo's input, the
   gate's Lambda code run locally; its CreateTrainingJob request drives step 4 (`lmstack.demo_sfn`);
4. train: that job on two local hosts through the real SageMaker training toolkit, with a
   spot interruption and a resume from the checkpoint (`lmstack.demo_train`);
5. evaluate: the evaluation job of that execution through the same toolkit: bits per byte per source of the
   validation documents and two lm-eval tasks made from the corpus (`lmstack.demo_evaluate`);
6. serve: `lm.serving.server` on 127.0.0.1 with the exported model, a few prompts;
7. synth: `npx cdk synth` offline and what `cdk deploy` would create;
8. report: `report.md` with the loss curve and the evaluation's tables (`lmstack.demo_report`).

Everything goes under `--output` (default `demo-output/`). A failing step stops the demo
with the step's name and the reason, exit status 1.
"""
import argparse
import collections
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from lm.spec import shards
from controlplane.presets import get_preset
from lmstack import demo_evaluate, demo_report, demo_sfn, demo_train
from lmstack.demo_run import ROOT, StepError, bar, cdk_environment, environment, run_logged, tail

DEFAULT_OUTPUT = "demo-output"
PROMPTS = ("The Python language", "def main(", "import os\n")
SERVER_START_SECONDS = 300


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    output: str = DEFAULT_OUTPUT
    corpus_bytes: int = 2 << 20
    preset: str = "tiny"
    strategy: str = "mwms"
    instance_count: int = 2
    max_steps: int = 400
    interrupt_at: int = 150
    global_batch_size: int = 16
    checkpoint_every: int = 50
    prompts: tuple = PROMPTS
    max_new_tokens: int = 32
    synth: bool = True
    name_prefix: str = "lmstack"  # the deployment's (stacks.settings.Settings' default)
    evaluation_examples: int = 40

    def execution_input(self, data_directory):
        """What a user would start the deployed state machine with (hyperparameters for 2 CPU cores)."""
        return {
            "preset": self.preset, "strategy": self.strategy, "instance_count": self.instance_count,
            "spot": True, "max_runtime_seconds": 3600, "data_directory": data_directory,
            "evaluate": demo_evaluate.execution_input_fields(self.name_prefix, self.evaluation_examples),
            "hyperparameters": {
                "max_steps": self.max_steps, "global_batch_size": self.global_batch_size,
                "learning_rate": 0.01, "scale_lr": False, "warmup_steps": 10, "log_every": 5,
                "checkpoint_every": self.checkpoint_every, "eval_every": 0, "eval_batches": 4, "xla": False,
            },
        }


def path(settings, *parts):
    return os.path.join(settings.output, *parts)


# ---- the steps: each takes the settings and the results so far, returns its own ----

def build_corpus(settings, results):
    """build the sample Pile-format corpus"""
    corpus = path(settings, "corpus")
    if os.path.exists(corpus):
        shutil.rmtree(corpus)
    run_logged([sys.executable, "-m", "lmstack.sample_corpus", corpus, "--max-bytes", str(settings.corpus_bytes)],
               path(settings, "logs", "corpus.log"), "lmstack.sample_corpus")
    files = sorted(os.listdir(corpus))
    print("  %s: %s (%d bytes compressed)" % (corpus, ", ".join(files),
                                             sum(os.path.getsize(os.path.join(corpus, name)) for name in files)))
    return {"corpus": corpus}


def prepare(settings, results):
    """tokenize it with lm.data.prepare (a BPE trained on it) into token shards"""
    config = get_preset(settings.preset)
    dataset = path(settings, "dataset")
    if os.path.exists(dataset):
        shutil.rmtree(dataset)
    command = [sys.executable, "-m", "lm.data.prepare", results["corpus"]["corpus"], "--output", dataset,
               "--train-tokenizer", "--vocab-size", str(config.vocab_size), "--seq-len", str(config.block_size),
               "--val-fraction", "0.05", "--workers", "1"]
    log = run_logged(command, path(settings, "logs", "prepare.log"), "lm.data.prepare")
    manifest = shards.load_manifest(dataset)
    records = manifest.records("train")
    if records < settings.global_batch_size:
        raise StepError("%s has %d training records of %d tokens, fewer than one global batch (%d); "
                        "give the corpus more bytes (--corpus-bytes, now %d)"
                        % (dataset, records, config.block_size, settings.global_batch_size, settings.corpus_bytes))
    unheld = sorted(set(manifest.sources) - set(manifest.val_sources))
    if unheld:
        # the report's bits per byte would leave these sources out without saying so
        raise StepError("%s holds no validation documents of %s; give the corpus more bytes (--corpus-bytes, now %d)"
                        % (dataset, ", ".join(unheld), settings.corpus_bytes))
    shard_bytes, text_bytes, tokens = demo_report.data_ratio(dataset)
    print("  %s: %d tokens (vocabulary %d, records of %d + 1 tokens); shard bytes / text bytes = %.3f"
          % (dataset, tokens, config.vocab_size, config.block_size, shard_bytes / text_bytes))
    return {"dataset": dataset, "log": log}


def run_state_machine(settings, results):
    """execute the training state machine on moto and take its CreateTrainingJob request"""
    from stacks.settings import Settings

    data_directory = "/datasets/demo"
    execution_input = settings.execution_input(data_directory)
    print("  input: %s" % json.dumps(execution_input))
    execution = demo_sfn.execute(Settings(), execution_input)
    print("  states (%d): %s" % (len(execution["states"]), " > ".join(_collapse(execution["states"]))))
    request = execution["request"]
    channel = request["InputDataConfig"][0]
    print("  CreateTrainingJob %s: %d x %s, image %s, channel %r = EFS %s -> local %s" % (
        request["TrainingJobName"], request["ResourceConfig"]["InstanceCount"], request["ResourceConfig"]["InstanceType"],
        request["AlgorithmSpecification"]["TrainingImage"], channel["ChannelName"],
        channel["DataSource"]["FileSystemDataSource"]["DirectoryPath"], results["prepare"]["dataset"]))
    print("  HyperParameters: %s" % ", ".join("%s=%s" % item for item in request["HyperParameters"].items()))
    record = path(settings, "state-machine-execution.json")
    with open(record, "w") as handle:
        json.dump({"input": execution_input, "states": execution["states"], "request": request,
                   "output": execution["output"]}, handle, indent=2)
    return dict(execution, record=record, channels={channel["ChannelName"]: results["prepare"]["dataset"]})


def _collapse(states):
    """Runs of one state ("Validate.Merge0", "Validate.Merge1", ...) shown once with a count."""
    shown = []
    for name in states:
        group = name.split(".")[0]
        if shown and shown[-1][0] == group:
            shown[-1][1] += 1
        else:
            shown.append([group, 1])
    return ["%s(%d)" % (group, count) if count > 1 else group for group, count in shown]


def train(settings, results):
    """train with 2 data-parallel workers through the SageMaker toolkit, interrupt, resume"""
    execution = results["state machine"]
    training = demo_train.train(execution["request"], execution["channels"], settings.output, settings.interrupt_at)
    attempts = [demo_report.train_points(log) for log in training["chief_logs"]]
    start, log_every = training["resume_step"], execution["request"]["HyperParameters"]["log_every"]
    resumed = [step for step, _ in attempts[1]]
    if not resumed or not start < resumed[0] <= start + int(log_every) or resumed[-1] != training["max_steps"]:
        raise StepError("the resumed attempt logged steps %s; expected %d+1 .. %d" % (
            resumed, start, training["max_steps"]))
    print("  SIGKILL at step %d; resumed from the periodic checkpoint of step %d to %d (%d steps lost); "
          "model exported to %s" % (training["killed_step"], start, training["max_steps"], training["lost_steps"],
                                    training["model_dir"]))
    return training


def evaluate(settings, results):
    """evaluate the model: the execution's evaluation job through the SageMaker toolkit (lm-eval, bits per byte)"""
    request = results["state machine"]["evaluation_request"]
    evaluation = demo_evaluate.evaluate(request, results["prepare"]["dataset"], results["train"]["model_dir"],
                                        settings.output, settings.evaluation_examples)
    print("  CreateTrainingJob %s: %s; results %s" % (request["TrainingJobName"], ", ".join(
        "%s=%.4f" % item for item in sorted(evaluation["metrics"].items())), evaluation["results_file"]))
    for line in demo_evaluate.table_lines(evaluation):
        print("  " + line)
    return evaluation


def serve(settings, results):
    """serve the exported model on 127.0.0.1 and send a few prompts"""
    import requests

    port = demo_train.free_ports(1)[0]
    url = "http://127.0.0.1:%d" % port
    log_path = path(settings, "logs", "serve.log")
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "lm.serving.server", "--model-dir", results["train"]["model_dir"], "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, env=environment(),
            cwd=ROOT, start_new_session=True)
    try:
        with bar("starting lm.serving.server on %s" % url) as progress:
            deadline = time.monotonic() + SERVER_START_SECONDS
            while True:
                if server.poll() is not None:
                    raise StepError("lm.serving.server exited with status %d; last lines of %s:\n%s"
                                    % (server.returncode, log_path, tail(log_path)))
                if time.monotonic() > deadline:
                    raise StepError("lm.serving.server not ready after %d s (log: %s)" % (SERVER_START_SECONDS, log_path))
                try:
                    if requests.get(url + "/ping", timeout=5).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                time.sleep(0.2)
                progress.refresh()
        body = {"inputs": list(settings.prompts),
                "parameters": {"max_new_tokens": settings.max_new_tokens, "temperature": 0.8, "top_k": 40, "seed": 0}}
        response = requests.post(url + "/invocations", json=body, timeout=120)
        if response.status_code != 200:
            raise StepError("POST /invocations answered %d: %s" % (response.status_code, response.text[:500]))
        generations = [item["generated_text"] for item in response.json()]
    finally:
        _stop_server(server)
    for prompt, text in zip(settings.prompts, generations):
        print("  %r -> %r" % (prompt, text))
    return {"prompts": list(settings.prompts), "generations": generations, "log": log_path, "url": url}


def _stop_server(server):
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def synth(settings, results):
    """synthesize the CDK app offline and count what `cdk deploy` would create"""
    if not settings.synth:
        print("  skipped (--skip-synth)")
        return None
    out = path(settings, "cdk.out")
    if os.path.exists(out):
        shutil.rmtree(out)
    npx = shutil.which("npx")
    if npx is None:
        raise StepError("npx not found: install Node.js (the CDK CLI is pinned in package.json)")
    log = run_logged([npx, "cdk", "synth", "--quiet", "--output", out], path(settings, "logs", "synth.log"),
                     "npx cdk synth", env=environment(**cdk_environment()), timeout=600)
    with open(os.path.join(out, "manifest.json")) as handle:
        manifest = json.load(handle)
    templates = []
    for name, artifact in sorted(manifest["artifacts"].items()):
        if artifact["type"] != "aws:cloudformation:stack":
            continue
        template = os.path.join(out, artifact["properties"]["templateFile"])
        templates.append(template)
        with open(template) as handle:
            resources = json.load(handle).get("Resources", {})
        counts = collections.Counter(resource["Type"] for resource in resources.values())
        print("  stack %s (%s): %d resources" % (name, template, len(resources)))
        for kind, count in sorted(counts.items()):
            print("    %4d  %s" % (count, kind))
    if not templates:
        raise StepError("%s/manifest.json lists no stack" % out)
    return {"templates": templates, "log": log}


def report(settings, results):
    """write report.md with the loss curve, tokens/s, the data bytes ratio and the artifacts"""
    written = demo_report.write_report(settings.output, results["prepare"]["dataset"], results["train"],
                                       results["serve"], results["synth"], results["state machine"],
                                       results["timings"], results["evaluate"])
    print("  %s, %s" % (written["report"], written["png"]))
    return written


STEPS = [("corpus", build_corpus), ("prepare", prepare), ("state machine", run_state_machine), ("train", train),
         ("evaluate", evaluate), ("serve", serve), ("synth", synth), ("report", report)]


class DemoFailed(Exception):
    def __init__(self, step, reason):
        super().__init__("step '%s' failed: %s" % (step, reason))
        self.step, self.reason = step, reason


def run(settings, steps=STEPS):
    """Run the steps in order; DemoFailed naming the first one that fails."""
    settings = dataclasses.replace(settings, output=os.path.abspath(settings.output))
    os.makedirs(path(settings, "logs"), exist_ok=True)
    results = {"timings": collections.OrderedDict()}
    started = time.monotonic()
    for index, (name, function) in enumerate(steps, 1):
        print("[%d/%d] %s: %s" % (index, len(steps), name, (function.__doc__ or "").strip()), flush=True)
        step_started = time.monotonic()
        try:
            results[name] = function(settings, results)
        except StepError as error:
            raise DemoFailed(name, str(error))
        except Exception as error:
            raise DemoFailed(name, "%s: %s" % (type(error).__name__, error))
        results["timings"][name] = time.monotonic() - step_started
        print("  done in %.1f s" % results["timings"][name], flush=True)
    print("demo finished in %.1f s; report: %s" % (time.monotonic() - started, path(settings, "report.md")))
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m lmstack.demo", description=__doc__.splitlines()[0])
    defaults = DemoSettings()
    parser.add_argument("--output", default=defaults.output, help="where everything goes [%(default)s]")
    parser.add_argument("--max-steps", type=int, default=defaults.max_steps, help="[%(default)s]")
    parser.add_argument("--interrupt-at", type=int, default=defaults.interrupt_at,
                        help="step after which every process of both hosts gets SIGKILL [%(default)s]")
    parser.add_argument("--corpus-bytes", type=int, default=defaults.corpus_bytes, help="[%(default)s]")
    parser.add_argument("--skip-synth", action="store_true", help="leave out `cdk synth` (about a minute)")
    args = parser.parse_args(argv)
    settings = DemoSettings(output=args.output, max_steps=args.max_steps, interrupt_at=args.interrupt_at,
                            corpus_bytes=args.corpus_bytes, synth=not args.skip_synth)
    try:
        run(settings)
    except DemoFailed as failure:
        print("demo failed: %s" % failure, file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
