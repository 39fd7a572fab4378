"""The tests marked `tf26`, run again on the SMP v1 image's framework: `.venv-tf26` (Python 3.8,
tensorflow-cpu 2.6.5 and the separate keras 2.6 package, the image's lock of its other packages;
`make test` builds it). There `tf.keras` is not the Keras that SMP's DistributedModel derives from,
as on the TF 2.6 DLC: the SMP adapter's tests against the strict fake (construction through the
library's path, training steps, checkpoints, the export, and a 2-partition run of
`python -m lm.training.train`), the model's and the training loop's pieces the image runs, and an
import of every module it runs.

One pytest in a subprocess over the files that hold such tests (FILES); tests/conftest.py, which
needs moto, stays out (`--confcutdir`)."""
import glob
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.path.join(ROOT, ".venv-tf26", "bin", "python")
# In the order the main suite loads their conftest files, the last of which sets TensorFlow's threads.
FILES = ("tests/image/test_image_imports.py", "tests/model/test_model.py", "tests/smdist/test_smp.py",
         "tests/smdist/test_train_loop.py", "tests/training/test_checkpoint.py", "tests/training/test_optim.py")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.access(PYTHON, os.X_OK),
                       reason=".venv-tf26 is missing: build it with `make .venv-tf26/.installed` (`make test` does)"),
]


def test_every_file_with_tf26_tests_is_run():
    marked = sorted(os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "tests", "**", "test_*.py"),
                                                                      recursive=True)
                    if "pytest.mark.tf26" in open(path).read() and path != os.path.abspath(__file__))
    assert marked == list(FILES)


def test_the_tf26_tests_pass_on_the_smp_images_framework():
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("SM_", "FAKE_", "PYTEST_")) and name not in ("TF_CONFIG", "PYTHONHOME")}
    env.update(PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "training_image"), os.path.join(ROOT, "tests")]),
               TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    versions = subprocess.run([PYTHON, "-c", "import sys; from importlib.metadata import version; print(sys.version_info[:2], "
                               "version('tensorflow-cpu'), version('keras'))"], env=env, stdout=subprocess.PIPE,
                              text=True, check=True).stdout.split()
    assert versions[:2] == ["(3,", "8)"] and versions[2].startswith("2.6.") and versions[3].startswith("2.6."), versions
    result = subprocess.run([PYTHON, "-m", "pytest", "-m", "tf26", "--confcutdir", "tests/tf26", "-o", "addopts=",
                             "-p", "no:cacheprovider", "-q", "-ra", *FILES], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=600)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0 and " passed" in summary and "skipped" not in summary, result.stdout[-6000:]
