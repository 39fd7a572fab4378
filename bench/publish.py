"""What every benchmark does with its report: print it as JSON and keep it in bench/results/."""
import json
import os

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def publish(name, report):
    print(json.dumps(report, indent=2))
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, name + ".json"), "w") as handle:
        json.dump(report, handle, indent=2)
