"""The training images' Python requirements, resolved for each image's Python and platform without
building anything: what tests/image/test_image_requirements.py checks, and how the locks are written.

Each runtime of `controlplane.base_images.RUNTIMES` is a TensorFlow DLC; its tag names the TensorFlow version, the
Python (`py38`) and the OS. The image installs `training_image/requirements/tf<major.minor>.txt`, the
lock of that TensorFlow's image: every package of `training_image/requirements.txt`'s closure, pinned,
resolved wheel-only (`pip --only-binary=:all:`, as the Dockerfile installs) for the image's Python and
glibc, and constrained by what that TensorFlow's own wheel requires (its Requires-Dist), so that no pin
contradicts the TensorFlow, numpy or protobuf the DLC already has. Runtimes whose TensorFlow ships
Keras 3 also get `tf<major.minor>-no-deps.txt`: the `tf_keras` of that TensorFlow, installed without its
dependency on `tensorflow` (the DLC's TensorFlow is already there). The evaluation runtime
(`EVALUATION_RUNTIME`) also gets `tf<major.minor>-eval.txt`, the lock of requirements.txt and
requirements-eval.txt together (lm-eval), which its image installs instead of the plain lock, after
building wheels of the pure-Python source distributions pinned in `tf<major.minor>-eval-sdists.txt`.

Regenerate the locks after changing training_image/requirements.txt or a runtime (needs PyPI):

    .venv/bin/python tests/image/image_requirements.py --write
"""
import collections
import functools
import json
import os
import subprocess
import sys
import tempfile

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "training_image")]

from controlplane.base_images import EVALUATION_RUNTIME, RUNTIMES  # noqa: E402

IMAGE = os.path.join(ROOT, "training_image")
REQUIREMENTS = os.path.join(IMAGE, "requirements.txt")
EVAL_REQUIREMENTS = os.path.join(IMAGE, "requirements-eval.txt")
LOCKS = os.path.join(IMAGE, "requirements")
DOCKERFILE = os.path.join(IMAGE, "Dockerfile")
# The glibc of each DLC's OS (the tag's last part): Ubuntu 20.04 ships glibc 2.31, Amazon Linux 2023
# glibc 2.34 (their release notes). A wheel tagged manylinux_2_X runs where glibc >= 2.X (PEP 600).
GLIBC = {"ubuntu20.04": 31, "amzn2023": 34}
# Keras 3 is `tf.keras` from TensorFlow 2.16: the image adds the tf_keras of the same minor version.
KERAS_3_FROM = (2, 16)

Target = collections.namedtuple("Target", "runtime python tensorflow platforms lock no_deps_lock eval_lock eval_sdists")


def target(runtime):
    """What the image of `runtime` is, read from its DLC tag ("2.6.0-gpu-py38-cu112-ubuntu20.04")."""
    tag = RUNTIMES[runtime]
    parts = tag.split("-")
    tensorflow = parts[0]
    python = next(part for part in parts if part.startswith("py"))[2:]
    python = "%s.%s" % (python[0], python[1:])
    glibc = next(GLIBC[part] for part in parts if part in GLIBC)
    platforms = tuple("manylinux_2_%d_x86_64" % minor for minor in range(glibc, 16, -1)) + ("manylinux2014_x86_64",)
    minor = ".".join(tensorflow.split(".")[:2])
    lock = os.path.join(LOCKS, "tf%s.txt" % minor)
    keras_3 = tuple(int(part) for part in minor.split(".")) >= KERAS_3_FROM
    evaluates = runtime == EVALUATION_RUNTIME
    return Target(runtime, python, tensorflow, platforms, lock,
                  os.path.join(LOCKS, "tf%s-no-deps.txt" % minor) if keras_3 else None,
                  os.path.join(LOCKS, "tf%s-eval.txt" % minor) if evaluates else None,
                  os.path.join(LOCKS, "tf%s-eval-sdists.txt" % minor) if evaluates else None)


class ResolutionFailed(AssertionError):
    """pip could not resolve the requirements for the image."""


def _pip(arguments, what):
    result = subprocess.run([sys.executable, "-m", "pip"] + arguments, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"))
    if result.returncode:
        raise ResolutionFailed("%s: pip failed:\n%s" % (what, "\n".join(
            line for line in result.stdout.splitlines() if "is ignored: it is neither a file" not in line)[-4000:]))


def build_sdist_wheels(sdists_lock, directory):
    """Build the wheels of the source distributions pinned in `sdists_lock` into `directory`, as the
    Dockerfile does (pip wheel --no-deps --no-binary=:all:); each must come out pure Python
    (py3-none-any: no compiler involved, and the same wheel for every Python 3). Returns `directory`."""
    read_lock(sdists_lock)  # pinned, name==version
    _pip(["wheel", "--quiet", "--no-deps", "--no-binary=:all:", "-r", sdists_lock, "-w", directory],
         "building the wheels of %s" % os.path.relpath(sdists_lock, ROOT))
    impure = [name for name in os.listdir(directory) if not name.endswith("-py3-none-any.whl")]
    if impure:
        raise ResolutionFailed("%s: %s are not pure-Python wheels" % (os.path.relpath(sdists_lock, ROOT), impure))
    return directory


def dry_run(target, arguments, *, deps=True):
    """{canonical name: (name, version)} of what `pip install <arguments>` would install into an empty
    directory for the image's Python and platform, taking wheels only (from the index, or the
    directories `arguments` name with --find-links). Raises ResolutionFailed."""
    with tempfile.TemporaryDirectory() as directory:
        report = os.path.join(directory, "report.json")
        platforms = [option for platform in target.platforms for option in ("--platform", platform)]
        _pip(["install", "--dry-run", "--quiet", "--ignore-installed", "--only-binary=:all:",
              "--python-version", target.python, "--implementation", "cp", *platforms,
              "--target", os.path.join(directory, "target"), "--report", report]
             + ([] if deps else ["--no-deps"]) + list(arguments),
             "%s (Python %s, %s)" % (" ".join(arguments), target.python, target.platforms[0]))
        with open(report) as handle:
            installed = json.load(handle)["install"]
    resolved = {}
    for item in installed:
        url = item["download_info"]["url"]
        if not url.endswith(".whl"):  # --only-binary should have made it so
            raise ResolutionFailed("%s resolves to %s, not a wheel" % (item["metadata"]["name"], url))
        resolved[canonicalize_name(item["metadata"]["name"])] = (item["metadata"]["name"], item["metadata"]["version"])
    return resolved


def marker_environment(target):
    """The environment markers of the image's interpreter (CPython on Linux x86_64)."""
    environment = default_environment()
    environment.update(python_version=target.python, python_full_version=target.python + ".0",
                       implementation_name="cpython", platform_python_implementation="CPython",
                       sys_platform="linux", platform_system="Linux", platform_machine="x86_64", os_name="posix")
    return environment


@functools.lru_cache(maxsize=None)
def tensorflow_constraints(target):
    """The requirements of the image's TensorFlow (its wheel's Requires-Dist, read by pip from PyPI
    without downloading the wheel) that apply on the image, as constraint lines: the DLC has them
    installed, and the image's install must not move them out of what TensorFlow accepts."""
    with tempfile.TemporaryDirectory() as directory:
        report = os.path.join(directory, "report.json")
        platforms = [option for platform in target.platforms for option in ("--platform", platform)]
        _pip(["install", "--dry-run", "--quiet", "--ignore-installed", "--only-binary=:all:", "--no-deps",
              "--python-version", target.python, "--implementation", "cp", *platforms,
              "--target", os.path.join(directory, "target"), "--report", report, "tensorflow==" + target.tensorflow],
             "tensorflow==%s (Python %s)" % (target.tensorflow, target.python))
        with open(report) as handle:
            (item,) = json.load(handle)["install"]
    environment = dict(marker_environment(target), extra="")
    lines = []
    for text in item["metadata"].get("requires_dist", []):
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            lines.append("%s%s" % (requirement.name, requirement.specifier))
    return tuple(sorted(lines))


def read_lock(path):
    """{canonical name: (name, version)} of a lock's `name==version` lines; any other requirement raises."""
    pins = {}
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            requirement = Requirement(line)
            specifiers = list(requirement.specifier)
            if len(specifiers) != 1 or specifiers[0].operator != "==" or "*" in specifiers[0].version \
                    or requirement.marker or requirement.url:
                raise ResolutionFailed("%s:%d: %r is not pinned (name==version): the image would install whatever "
                                       "the index offers that day" % (os.path.relpath(path, ROOT), number, line))
            pins[canonicalize_name(requirement.name)] = (requirement.name, specifiers[0].version)
    return pins


def resolve_lock(target, path, *, deps=True, find_links=None):
    """Resolve the lock at `path` for the image, wheel-only, with its TensorFlow's requirements as
    constraints; it must resolve to exactly its own pins (nothing missing, nothing else pulled in).
    `find_links`: a directory of wheels built for it (build_sdist_wheels)."""
    pins = read_lock(path)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write("\n".join(tensorflow_constraints(target)) + "\n")
        constraints.flush()
        resolved = dry_run(target, ["-r", path] + (["-c", constraints.name] if deps else [])
                           + (["--find-links", find_links] if find_links else []), deps=deps)
    unpinned = sorted("%s==%s" % resolved[name] for name in set(resolved) - set(pins))
    if unpinned:
        raise ResolutionFailed("%s does not pin %s, which its requirements pull in for Python %s"
                               % (os.path.relpath(path, ROOT), ", ".join(unpinned), target.python))
    return pins


def lock_text(target, resolved, source):
    lines = ["# The %s image (%s: TensorFlow %s, Python %s): %s" % (target.runtime, RUNTIMES[target.runtime],
                                                                    target.tensorflow, target.python, source),
             "# Written by tests/image/image_requirements.py --write; checked by tests/image/test_image_requirements.py."]
    return "\n".join(lines + ["%s==%s" % resolved[name] for name in sorted(resolved)]) + "\n"


def write_locks():
    """Resolve training_image/requirements.txt (and tf_keras) afresh for every runtime and write the locks."""
    os.makedirs(LOCKS, exist_ok=True)
    for runtime in RUNTIMES:
        image = target(runtime)
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
            constraints.write("\n".join(tensorflow_constraints(image)) + "\n")
            constraints.flush()
            resolved = dry_run(image, ["-r", REQUIREMENTS, "-c", constraints.name])
        with open(image.lock, "w") as handle:
            handle.write(lock_text(image, resolved, "training_image/requirements.txt and its dependencies, "
                                                    "within what TensorFlow %s requires" % image.tensorflow))
        if image.no_deps_lock:
            minor = ".".join(image.tensorflow.split(".")[:2])
            keras = dry_run(image, ["tf_keras==%s.*" % minor], deps=False)
            with open(image.no_deps_lock, "w") as handle:
                handle.write(lock_text(image, keras, "Keras 2 (tf_keras) of TensorFlow %s, installed without its "
                                                     "dependency on tensorflow" % minor))
        if image.eval_lock:
            with tempfile.TemporaryDirectory() as wheels, \
                    tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
                constraints.write("\n".join(tensorflow_constraints(image)) + "\n")
                constraints.flush()
                # The plain lock's pins as constraints: the evaluation image differs only by lm-eval's packages.
                resolved = dry_run(image, ["-r", REQUIREMENTS, "-r", EVAL_REQUIREMENTS, "-c", constraints.name,
                                           "-c", image.lock, "--find-links", build_sdist_wheels(image.eval_sdists,
                                                                                                wheels)])
            with open(image.eval_lock, "w") as handle:
                handle.write(lock_text(image, resolved, "training_image/requirements.txt, requirements-eval.txt "
                                                        "and their dependencies, within what TensorFlow %s requires"
                                                        % image.tensorflow))
        print("wrote", os.path.relpath(image.lock, ROOT))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    write_locks()
