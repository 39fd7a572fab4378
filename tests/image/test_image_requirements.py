"""Every training image's Python install resolves for that image's Python and platform, wheels only, to
the pins of its lock, within what its TensorFlow requires; and the Dockerfile installs it that way.

Nothing is built or installed: `pip install --dry-run --ignore-installed --only-binary=:all:
--python-version X --platform ... --report` against PyPI (see image_requirements.py). A requirement
that exists only as a source distribution for an image's Python (tokenizers 0.21 for Python 3.8 needs
Rust, which the DLCs lack) or a floating requirement fails here instead of in `cdk deploy`."""
import os
import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from image_requirements import (DOCKERFILE, EVAL_REQUIREMENTS, LOCKS, REQUIREMENTS, ResolutionFailed,
                                build_sdist_wheels, dry_run, read_lock, resolve_lock, target)
from controlplane.base_images import EVALUATION_RUNTIME, RUNTIMES


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_each_images_lock_resolves_wheel_only_for_its_python_to_its_own_pins(runtime):
    image = target(runtime)
    assert os.path.isfile(image.lock), "no lock for %s (TensorFlow %s): run tests/image/image_requirements.py " \
                                       "--write" % (runtime, image.tensorflow)
    pins = resolve_lock(image, image.lock)
    # The lock is of training_image/requirements.txt: every requirement pinned, within its range.
    with open(REQUIREMENTS) as handle:
        wanted = [Requirement(line) for line in (line.split("#", 1)[0].strip() for line in handle) if line]
    for requirement in wanted:
        name, version = pins.get(canonicalize_name(requirement.name), (requirement.name, None))
        assert version is not None and requirement.specifier.contains(version, prereleases=True), \
            "%s pins %s==%s, outside %s" % (os.path.basename(image.lock), name, version, requirement)
    if image.no_deps_lock:
        ((name, version),) = resolve_lock(image, image.no_deps_lock, deps=False).values()
        assert canonicalize_name(name) == "tf-keras" and version.startswith(image.tensorflow.rsplit(".", 1)[0] + ".")


def test_only_the_evaluation_image_carries_lm_eval_and_its_lock_resolves_wheel_only(tmp_path):
    assert [runtime for runtime in RUNTIMES if target(runtime).eval_lock] == [EVALUATION_RUNTIME]
    image = target(EVALUATION_RUNTIME)
    sdists = read_lock(image.eval_sdists)
    for name, version in sdists.values():  # no wheel on the index: the image must build it
        with pytest.raises(ResolutionFailed):
            dry_run(image, ["--no-deps", "%s==%s" % (name, version)], deps=False)
    wheels = build_sdist_wheels(image.eval_sdists, str(tmp_path))
    pins = resolve_lock(image, image.eval_lock, find_links=wheels)
    assert set(sdists) <= set(pins) and all(pins[name] == sdists[name] for name in sdists)
    # The evaluation image is the training image plus lm-eval: every pin of the plain lock, unchanged.
    plain = read_lock(image.lock)
    assert {name: pins.get(name) for name in plain} == plain
    with open(EVAL_REQUIREMENTS) as handle:
        wanted = [Requirement(line) for line in (line.split("#", 1)[0].strip() for line in handle) if line]
    for requirement in wanted:
        name, version = pins[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(version), (name, version, str(requirement))


@pytest.mark.parametrize("lock, refused", [
    # tokenizers 0.21.0 exists for Python 3.8 only as a source distribution: the TF 2.6 image would have
    # to build it with Rust. So would today's `tokenizers>=0.13` without --only-binary.
    ("tokenizers==0.21.0", "tokenizers"),
    ("tokenizers>=0.13", r"'tokenizers>=0.13' is not pinned"),
    ("tokenizers==0.20.3", "does not pin .*huggingface"),
    # TensorFlow 2.6 requires typing-extensions~=3.7.4 (its wheel's metadata): the DLC has such a one,
    # and a newer pin would upgrade it underneath TensorFlow.
    ("typing-extensions==4.13.2", "typing.extensions"),
], ids=["no wheel for 3.8", "floating", "dependencies unpinned", "against TensorFlow"])
def test_a_lock_the_tf26_image_could_not_install_as_locked_fails(tmp_path, lock, refused):
    path = tmp_path / "tf2.6.txt"
    path.write_text(lock + "\n")
    with pytest.raises(ResolutionFailed, match=refused):
        resolve_lock(target("tf26"), str(path))


def test_the_dockerfile_installs_its_tensorflows_lock_wheel_only_without_moving_what_the_dlc_has():
    with open(DOCKERFILE) as handle:
        text = handle.read().replace("\\\n", " ")
    installs = [line for line in text.splitlines() if "pip install" in line]
    pip_calls = [call for line in installs for call in re.findall(r"pip install[^&;]*", line)]
    assert pip_calls and all("--only-binary=:all:" in call for call in pip_calls), pip_calls
    # The lock of the image's own TensorFlow, under the DLC's installed versions as constraints.
    assert any("-c " in call and "-r " in call for call in pip_calls), pip_calls
    assert 'tf${tf_minor}' in text and "pip list --format=freeze" in text
    assert sorted(os.listdir(LOCKS)) == sorted(
        os.path.basename(path) for runtime in RUNTIMES for path in (
            target(runtime).lock, target(runtime).no_deps_lock, target(runtime).eval_lock, target(runtime).eval_sdists)
        if path)
    # Only the source distributions of the sdists list are built, without their dependencies, and the
    # install finds their wheels.
    (wheel_call,) = re.findall(r"pip wheel[^&;]*", text)
    assert "--no-deps" in wheel_call and '-eval-sdists.txt"' in wheel_call and "-w /tmp/lm-wheels" in wheel_call
    assert all("--find-links /tmp/lm-wheels" in call for call in pip_calls if "missing.txt" in call)
