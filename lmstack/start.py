"""`python -m lmstack.start`: start a training run on the deployed state machine.

With your own AWS credentials (boto3's default chain: environment, profile, SSO, instance
role; `--profile` picks a named profile) it reads the state machine ARN from the stack's
CloudFormation outputs, builds the execution input from a preset and flags, asks the gate about it
(`controlplane.gate`, the code the state machine's Validate state runs as a Lambda function: the
schema, the rules, the exact plan) so a mistake starts nothing, starts the execution, prints the plan
and its console URL and, with `--watch`, follows
it with a one-line status until it ends. Exit status 0 only when the execution succeeded
(or, without `--watch`, was started).

    python -m lmstack.start --preset gpt-125m --instance-type ml.g5.2xlarge --hp max_steps=200 --watch

With `--upload-corpus PATH` it first uploads a local corpus (a Pile-format file, or a directory of
them) to `s3://<artifact bucket>/raw/<name>/` and prepares the dataset from there in the same run
(`prepare.enabled`, `prepare.raw_s3_uri`) into a directory of that corpus's own,
`/corpora/<name>` (unless `--dataset` or the input names one): a directory holds one dataset. Files
already there with the same size are skipped, so an interrupted upload resumes.

With `--resume-from NAME` the run continues the checkpoints of an earlier execution (the name its
failure output gives): the execution input's `resume_from`.
"""
import argparse
import collections
import datetime
import json
import os
import re
import sys
import time
import uuid

from botocore.exceptions import BotoCoreError, ClientError

from controlplane import bucket_layout
from controlplane import aws_clients, gate, inputs, request, rules
from controlplane.presets import ALL_PRESETS
from lm.data.pile import INPUT_SUFFIXES
from lm.spec.job import STRATEGIES
from lmstack import cdk_settings
from stacks.settings import SettingsError
from stacks.state_machine import jobs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE_MACHINE_OUTPUT = "StateMachineArn"
BUCKET_OUTPUT = "ArtifactBucketName"
# In a dry run's input the bucket is not known yet: it comes from the stack's outputs.
BUCKET_PLACEHOLDER = "<%s>" % BUCKET_OUTPUT
CORPUS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# An uploaded corpus is prepared into UPLOADED_DATASETS/<its name> unless a data_directory is given.
UPLOADED_DATASETS = "/corpora/"
# The execution name's rule (controlplane.rules.name_rules): it becomes a tag value and part of S3 keys.
EXECUTION_NAME_RULE = next(found for found in rules.name_rules("") if found.path == rules.EXECUTION_NAME)
EXECUTION_NAME = re.compile(r"^[%s]{1,%d}$" % (re.escape(EXECUTION_NAME_RULE.alphabet), EXECUTION_NAME_RULE.max_length))
FINAL_STATUSES = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")


class StartError(Exception):
    """A problem the user can fix; the message says which flag or resource."""


# ---- the execution input ----

def parse_hyperparameter(item):
    """`key=value` with the value JSON-decoded (`max_steps=200`, `xla=false`), else kept as a string."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise StartError("--hp expects key=value, got %r" % item)
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value


def build_input(args):
    """The execution input: `--input` overlaid with the flags that were given; the state machine
    fills in the rest from its defaults."""
    try:
        execution_input = json.loads(args.input, object_pairs_hook=collections.OrderedDict) if args.input else {}
    except ValueError as error:
        raise StartError("--input is not valid JSON: %s" % error)
    if not isinstance(execution_input, dict):
        raise StartError("--input must be a JSON object, got %s" % args.input)
    for key, value in (("preset", args.preset), ("strategy", args.strategy), ("instance_type", args.instance_type),
                       ("instance_count", args.instance_count), ("max_runtime_seconds", args.max_runtime),
                       ("spot", args.spot), ("data_directory", args.dataset), ("min_quality", args.min_quality),
                       ("resume_from", args.resume_from)):
        if value is not None:
            execution_input[key] = value
    if args.hp:
        hyperparameters = execution_input.setdefault("hyperparameters", collections.OrderedDict())
        if not isinstance(hyperparameters, dict):
            raise StartError("--input: hyperparameters must be a JSON object")
        hyperparameters.update(parse_hyperparameter(item) for item in args.hp)
    for stage, enabled, extra in (("prepare", args.prepare, {}),
                                  ("evaluate", args.evaluate, {
                                      "tasks": args.eval_tasks.split(",") if args.eval_tasks is not None else None,
                                      "data_s3_uri": args.eval_data, "instance_type": args.eval_instance_type,
                                      "limit": args.eval_limit}),
                                  ("deploy", args.deploy, {"endpoint_name": args.endpoint_name})):
        extra = {key: value for key, value in extra.items() if value is not None}
        if enabled or extra:
            section = execution_input.setdefault(stage, collections.OrderedDict())
            if not isinstance(section, dict):
                raise StartError("--input: %s must be a JSON object" % stage)
            if enabled:
                section["enabled"] = True
            section.update(extra)
    if args.upload_corpus:
        prepare = execution_input.setdefault("prepare", collections.OrderedDict())
        if not isinstance(prepare, dict):
            raise StartError("--input: prepare must be a JSON object")
        prepare["enabled"] = True
        prepare["raw_s3_uri"] = corpus_uri(BUCKET_PLACEHOLDER, corpus_name(args))
        execution_input.setdefault("data_directory", UPLOADED_DATASETS + corpus_name(args))
        corpus_files(args.upload_corpus)  # a bad path stops here, before anything is uploaded or started
    return execution_input


# ---- a local corpus into the artifact bucket ----

def corpus_name(args):
    """The corpus's name below raw/: --corpus-name, or the file or directory name without suffixes."""
    name = args.corpus_name
    if name is None:
        name = os.path.basename(os.path.normpath(args.upload_corpus))
        for suffix in INPUT_SUFFIXES:
            if name.endswith(suffix):
                name = name[:-len(suffix)]
                break
    if not CORPUS_NAME.match(name):
        raise StartError("--corpus-name: %r must be 1-100 letters, digits, . _ - (it becomes part of S3 keys)" % name)
    return name


def corpus_uri(bucket, name):
    return "s3://%s/%s%s/" % (bucket, bucket_layout.RAW_PREFIX, name)


def corpus_files(path):
    """(local path, key below the corpus prefix) of a file, or of every file under a directory."""
    if os.path.isfile(path):
        found = [(path, os.path.basename(path))]
    elif os.path.isdir(path):
        found = []
        for directory, subdirectories, files in os.walk(path):
            subdirectories.sort()
            found.extend((os.path.join(directory, name), os.path.relpath(os.path.join(directory, name), path)
                          .replace(os.sep, "/")) for name in sorted(files))
    else:
        raise StartError("--upload-corpus: %s: no such file or directory" % path)
    if not any(key.endswith(INPUT_SUFFIXES) for _, key in found):
        raise StartError("--upload-corpus: %s holds no %s files (the Pile format lm.data.prepare reads)"
                         % (path, " / ".join(INPUT_SUFFIXES)))
    return found


def upload_corpus(s3, bucket, path, name, out):
    """Upload the corpus at `path` below raw/<name>/ of `bucket` (boto3's managed, multipart transfer);
    a key that already holds an object of the same size is skipped. Returns the prefix's S3 URI."""
    prefix = "%s%s/" % (bucket_layout.RAW_PREFIX, name)
    for local, key in corpus_files(path):
        size = os.path.getsize(local)
        try:
            if s3.head_object(Bucket=bucket, Key=prefix + key)["ContentLength"] == size:
                out.write("already uploaded: s3://%s/%s%s\n" % (bucket, prefix, key))
                continue
        except ClientError as error:
            if error.response["Error"].get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        out.write("uploading %s (%d bytes) to s3://%s/%s%s\n" % (local, size, bucket, prefix, key))
        s3.upload_file(local, bucket, prefix + key)
    return corpus_uri(bucket, name)


def validate_input(execution_input, settings, clients=None, region=None):
    """The gate's decision about the input (`controlplane.gate.decide`: the same checks and plan as the state
    machine's Validate state), or StartError with the gate's words; nothing starts on a refused input.
    `clients`: the AWS clients of the session (the quota check asks Service Quotas, the prices the AWS Price List),
    None to ask no AWS; `region`: the stack's, whose prices the plan uses."""
    try:
        return gate.decide(execution_input, gate.Context(gate.Deployment.of(settings), clients=clients, region=region))
    except gate.Refusal as refusal:
        raise StartError(str(refusal))


def plan_line(plan):
    """One line of the gate's plan: what the run will use and cost."""
    if plan.get("deploy_only"):
        return "plan: serve %s (preset %s), no prepare or training job" % (plan["model_artifact"], plan["preset"])
    cost = "-" if plan["cost_usd"] is None else ("$%.0f" if plan["cost_usd"] >= 100 else "$%.2f") % plan["cost_usd"]
    hours = "-" if plan["hours"] is None else "%.1f hours" % plan["hours"]
    return "plan: %s on %d x %s, %d sequences per device, %.1f of %.1f GiB per GPU, %s, %s" % (
        plan["strategy"], plan["instance_count"], plan["instance_type"], plan["per_device_batch"],
        plan["memory_gib"], plan["usable_gib"], hours, cost)


def write_notes(decision, out):
    for note in decision.notes:
        out.write("note: %s\n" % note)


def write_decision(decision, out):
    """What the gate decided about the input, as the execution would get it: the plan in a line (strategy,
    memory, hours, dollars) and the notes."""
    out.write(plan_line(decision.plan) + "\n")
    write_notes(decision, out)


def training_request(execution_input, settings, name):
    """The CreateTrainingJob request of the execution's first training attempt, from the same
    builder the state machine is generated from (`controlplane.request`), with this input's values as
    the gate leaves them. `${Name}` stands for a resource of the deployed stack; the job name's middle
    part is the MD5 of the execution ARN, which only Step Functions knows."""
    config = validate_input(execution_input, settings).config
    if config["deploy"]["model_artifact"] is not None:
        raise StartError("--show-request: this run only deploys deploy.model_artifact; it sends no CreateTrainingJob")
    values = jobs.concrete_values(jobs.TRAIN, settings, config, execution_name=name,
                                  job_name="%s-train-<md5 of the execution ARN>-1" % settings.name_prefix)
    return request.create_training_job_request(values)


def execution_name(given, execution_input, now):
    if given is not None:
        message = rules.name_problem(EXECUTION_NAME_RULE, given)
        if message:
            raise StartError("--name: %s" % message)
        return given
    preset = re.sub(r"[^A-Za-z0-9]+", "-", str(execution_input.get("preset", "run")))
    return "%s-%s-%s" % (preset, now.strftime("%Y%m%d-%H%M%S"), uuid.uuid4().hex[:6])


# ---- AWS ----

def load_settings(cdk_json):
    """The app's settings as `cdk deploy` saw them: the `lmstack` context of cdk.json (defaults if absent)."""
    try:
        return cdk_settings.load(cdk_json)[0]
    except SettingsError as error:
        raise StartError(str(error))


def stack_output(cloudformation, stack_name, key):
    try:
        stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        raise StartError("cannot read stack %r: %s (deploy it with `npx cdk deploy --all`, or pass --stack-name)"
                         % (stack_name, error.response["Error"].get("Message", error)))
    outputs = {output["OutputKey"]: output["OutputValue"] for output in stacks[0].get("Outputs", [])}
    if key not in outputs:
        raise StartError("stack %r has no output %s; its outputs: %s"
                         % (stack_name, key, ", ".join(sorted(outputs)) or "none"))
    return outputs[key]


def state_machine_arn(cloudformation, stack_name):
    return stack_output(cloudformation, stack_name, STATE_MACHINE_OUTPUT)


def console_url(execution_arn):
    region = execution_arn.split(":")[3]
    return "https://%s.console.aws.amazon.com/states/home?region=%s#/v2/executions/details/%s" % (
        region, region, execution_arn)


def current_state(stepfunctions, execution_arn):
    """The state the execution entered last, from the newest page of its history (by event id,
    whatever order the page comes in)."""
    events = stepfunctions.get_execution_history(
        executionArn=execution_arn, reverseOrder=True, maxResults=100)["events"]
    entered = [event for event in events if "stateEnteredEventDetails" in event]
    if not entered:
        return None
    return max(entered, key=lambda event: event["id"])["stateEnteredEventDetails"]["name"]


def _elapsed(seconds):
    seconds = int(max(0, seconds))
    return "%d:%02d:%02d" % (seconds // 3600, seconds % 3600 // 60, seconds % 60)


def watch(stepfunctions, execution_arn, poll_seconds, out, sleep=time.sleep):
    """Print one status line per poll until the execution ends; return its describe result."""
    line_end = "\r" if out.isatty() else "\n"
    previous = None
    while True:
        execution = stepfunctions.describe_execution(executionArn=execution_arn)
        status = execution["status"]
        end = execution.get("stopDate") or datetime.datetime.now(datetime.timezone.utc)
        line = "%-9s %-40s elapsed %s" % (status, current_state(stepfunctions, execution_arn) or "-",
                                          _elapsed((end - execution["startDate"]).total_seconds()))
        if line != previous:
            out.write(line.ljust(len(previous or "")) + line_end)
            out.flush()
            previous = line
        if status in FINAL_STATUSES:
            if line_end == "\r":
                out.write("\n")
            return execution
        sleep(poll_seconds)


def report_end(execution, out):
    """The execution's end: its output, or its error and cause (which hold the run's bill); a completed run's bill
    (`controlplane.bill`) on the last line."""
    if execution["status"] == "SUCCEEDED":
        out.write("output: %s\n" % execution.get("output", "{}"))
        billed = json.loads(execution.get("output") or "{}").get("bill")
        if billed:
            out.write("%s\n" % billed["text"])
    else:
        out.write("%s: %s\n%s\n" % (execution["status"], execution.get("error", ""), execution.get("cause", "")))


# ---- command line ----

def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m lmstack.start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cdk-json", default=os.path.join(ROOT, "cdk.json"),
                        help="the app's cdk.json, for the stack name, region and defaults it was deployed with")
    parser.add_argument("--stack-name", help="CloudFormation stack (default: name_prefix in cdk.json)")
    parser.add_argument("--region", help="AWS region (default: region in cdk.json)")
    parser.add_argument("--profile", help="named AWS profile (default: boto3's credential chain)")
    parser.add_argument("--input", metavar="JSON", help="a whole or partial execution input; flags override it")
    parser.add_argument("--preset", help="model shape: %s" % ", ".join(ALL_PRESETS))
    parser.add_argument("--strategy", help="distribution strategy: %s" % ", ".join(STRATEGIES))
    parser.add_argument("--instance-type", help="SageMaker instance type, e.g. ml.p4d.24xlarge")
    parser.add_argument("--instance-count", type=int)
    parser.add_argument("--max-runtime", type=int, help="seconds before SageMaker stops the job")
    parser.add_argument("--spot", action="store_true", default=None, help="managed spot training")
    parser.add_argument("--dataset", help="dataset directory on the EFS file system")
    parser.add_argument("--hp", action="append", metavar="KEY=VALUE",
                        help="a training hyperparameter, value JSON-decoded; repeatable; names: %s"
                             % ", ".join(spec.name for spec in inputs.input_hyperparameters()))
    parser.add_argument("--prepare", action="store_true", default=None,
                        help="prepare the dataset first (skipped when it exists)")
    parser.add_argument("--upload-corpus", metavar="PATH",
                        help="upload this local corpus (a .jsonl/.jsonl.zst file or a directory) to the artifact "
                             "bucket's raw/ prefix first and prepare the dataset from it in this run")
    parser.add_argument("--corpus-name", help="its name below raw/ and %s (default: the file or directory name)"
                        % UPLOADED_DATASETS)
    parser.add_argument("--evaluate", action="store_true", default=None,
                        help="evaluate the trained model before deploy (docs/evaluation.md)")
    parser.add_argument("--eval-tasks", metavar="A,B", help="evaluate.tasks: lm-eval task names or task YAML files")
    parser.add_argument("--eval-data", metavar="S3URI", help="evaluate.data_s3_uri: the tasks' staged data")
    parser.add_argument("--eval-instance-type", help="evaluate.instance_type (a CPU type for small models)")
    parser.add_argument("--eval-limit", type=int, help="evaluate.limit: examples per task at most")
    parser.add_argument("--deploy", action="store_true", default=None, help="deploy an endpoint after training")
    parser.add_argument("--endpoint-name", help="endpoint name after '<name_prefix>-' (an existing one is updated)")
    parser.add_argument("--min-quality", type=float, help="deploy only if the final validation loss is at most this")
    parser.add_argument("--resume-from", metavar="NAME",
                        help="continue the checkpoints of an earlier execution (the name its failure output gives)")
    parser.add_argument("--name", help="execution name (default: generated)")
    parser.add_argument("--watch", action="store_true", help="follow the execution until it ends")
    parser.add_argument("--poll-seconds", type=float, default=10.0, help="seconds between status polls")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the input and the gate's decision (plan and notes; quotas not asked) and start "
                             "nothing")
    parser.add_argument("--show-request", action="store_true",
                        help="print the CreateTrainingJob request the run would send and start nothing")
    return parser.parse_args(argv)


def main(argv=None, session=None, out=sys.stdout, sleep=time.sleep):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = load_settings(args.cdk_json)
        execution_input = build_input(args)
        offline = args.show_request or args.dry_run
        # a bad input stops here, before anything asks AWS (asked, the gate asks AWS only after the input's own
        # checks: its quotas, and prices the table may lack, which the Price List's decide)
        decision = validate_input(execution_input, settings) if offline else None
        name = execution_name(args.name, execution_input, datetime.datetime.now(datetime.timezone.utc))
        if args.show_request:
            out.write(json.dumps(training_request(execution_input, settings, name), indent=2) + "\n")
            return 0
        if args.dry_run:
            out.write(json.dumps(execution_input, indent=2) + "\n")
            write_decision(decision, out)
            return 0
        if session is None:
            import boto3
            session = boto3.Session(profile_name=args.profile, region_name=args.region or settings.region)
        # the account's quotas and the Price List's prices too, each call ending within the time the gate's
        # function gives it
        decision = validate_input(execution_input, settings, region=session.region_name,
                                  clients=lambda service, region_name=None: session.client(
                                      service, region_name=region_name, config=aws_clients.config(gate.AWS_CALL_SECONDS)))
        write_notes(decision, out)
        cloudformation = session.client("cloudformation")
        stack_name = args.stack_name or settings.name_prefix
        arn = state_machine_arn(cloudformation, stack_name)
        if args.upload_corpus:
            bucket = stack_output(cloudformation, stack_name, BUCKET_OUTPUT)
            execution_input["prepare"]["raw_s3_uri"] = upload_corpus(
                session.client("s3"), bucket, args.upload_corpus, corpus_name(args), out)
        stepfunctions = session.client("stepfunctions")
        started = stepfunctions.start_execution(stateMachineArn=arn, name=name, input=json.dumps(execution_input))
    except StartError as error:
        sys.stderr.write("error: %s\n" % error)
        return 2
    except (BotoCoreError, ClientError) as error:
        sys.stderr.write("error: AWS refused: %s\n" % error)
        return 2
    execution_arn = started["executionArn"]
    out.write("started %s\ninput: %s\n%s\nconsole: %s\n" % (name, json.dumps(execution_input), plan_line(decision.plan),
                                                          console_url(execution_arn)))
    if not args.watch:
        return 0
    execution = watch(stepfunctions, execution_arn, args.poll_seconds, out, sleep=sleep)
    report_end(execution, out)
    return 0 if execution["status"] == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
