"""The deployment's settings as `cdk deploy` read them: the `lmstack` context of the app's cdk.json
(`stacks.settings.Settings`, the defaults where the file or the key is absent), for the commands that must
decide as the deployed gate does (`lmstack.start`, `lmstack.plan`)."""
import json
import os

from stacks.settings import CONTEXT_KEY, Settings, SettingsError

DEFAULT_CDK_JSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cdk.json")


def load(cdk_json):
    """(Settings, where they came from: "<path>", or "the defaults (no <path>)", the path relative to the working
    directory); SettingsError naming the file where it cannot be read or a setting is invalid."""
    shown = os.path.relpath(cdk_json)
    try:
        with open(cdk_json) as handle:
            context = json.load(handle).get("context", {})
        source = shown
    except FileNotFoundError:
        context, source = {}, "the defaults (no %s)" % shown
    except (OSError, ValueError) as error:
        raise SettingsError("cannot read %s: %s" % (cdk_json, error))
    try:
        return Settings.from_context({key: value for key, value in context.items()
                                      if key == CONTEXT_KEY or key.startswith(CONTEXT_KEY + ":")}), source
    except SettingsError as error:
        raise SettingsError("%s: %s" % (cdk_json, error))
