"""The Step Functions definitions (Amazon States Language, JSONPath) as plain JSON documents.

Pure Python, no CDK: the CDK app deploys the documents as files (`DefinitionBody.from_file`,
stacks.orchestration) with `definition_substitutions`; the tests execute the very same documents
on moto's engine.

- `build_training_definition(settings)`: the main (Standard) machine: the gate (a Lambda function
  that checks the input, applies its defaults and plans the run), [prepare], train (create + monitor
  loop, fallback instance types), [deploy].
- `build_stop_definition(settings)`: started by an EventBridge rule on the main machine's
  ABORTED / TIMED_OUT status change; stops that execution's running jobs.
- `training_substitutions(settings)` / `stop_substitutions(settings)`: every `${Name}`
  placeholder each definition uses (fixed names in TRAINING_SUBSTITUTIONS /
  STOP_SUBSTITUTIONS, plus `Subnet<i>` for i < subnet_count and `Image_<runtime>` per enabled
  runtime). `render(definition, values)` fills them (tests; the CDK does it at deploy).
- `definition_text(definition)`: the JSON text the CDK app deploys (no spaces between tokens:
  CloudFormation refuses a definition file over 1,048,576 bytes).
- `EXAMPLE_INPUT`: a small execution input.
- `REQUIRED_ACTIONS`: the IAM actions each definition calls and the resource each targets.
"""
import json

from stacks.state_machine.names import (
    REQUIRED_ACTIONS,
    STOP_SUBSTITUTIONS,
    TRAINING_SUBSTITUTIONS,
    render,
    stop_substitutions,
    training_substitutions,
)
from stacks.state_machine.training import EXAMPLE_INPUT, build_training_definition
from stacks.state_machine.stop import build_stop_definition

__all__ = [
    "EXAMPLE_INPUT",
    "REQUIRED_ACTIONS",
    "STOP_SUBSTITUTIONS",
    "TRAINING_SUBSTITUTIONS",
    "build_stop_definition",
    "build_training_definition",
    "definition_text",
    "render",
    "stop_substitutions",
    "training_substitutions",
]


def definition_text(definition):
    """The definition as the CDK app deploys it: compact JSON."""
    return json.dumps(definition, separators=(",", ":"))
