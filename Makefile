# lmstack: `make test` and `make demo` do all set-up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# A second environment on current TensorFlow (Keras 2 via tf_keras), for the compatibility smoke test.
VENV_TF_CURRENT := .venv-tfcurrent
# The SMP v1 image's framework (TF 2.6 DLC): Python 3.8, TensorFlow 2.6 and the separate keras 2.6
# package, for the tests of tests/tf26 (tests/tf26/test_on_tf26.py runs them there).
VENV_TF26 := .venv-tf26
VENV_HF := .venv-hf
VENV_MLFLOW := .venv-mlflow
MLFLOW_VERSION := 2.22.1

# Keep the CDK CLI and jsii offline and quiet.
export CDK_DISABLE_CLI_TELEMETRY := true
export CDK_DISABLE_VERSION_CHECK := true
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_KNOWN_BROKEN_NODE_VERSION := 1
# jsii names the Node major versions whose end-of-life banner it should skip.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := $(shell node -p "process.versions.node.split('.')[0]" 2>/dev/null)
# The CDK CLI's bundled AWS SDK warns about the Node version on every run.
export AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED := true
export TF_CPP_MIN_LOG_LEVEL := 2
export PIP_DISABLE_PIP_VERSION_CHECK := 1

HOROVOD_BUILD_ENV := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1

.PHONY: setup test demo synth lint bench clean

setup: $(VENV)/.installed $(VENV)/.horovod $(VENV_TF_CURRENT)/.installed $(VENV_TF26)/.installed $(VENV_HF)/.installed \
	$(VENV_MLFLOW)/.installed node_modules/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt training_image/requirements.txt training_image/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -r requirements-dev.txt
	# tf_keras declares a dependency on `tensorflow`, which would install next to tensorflow-cpu.
	$(PY) -m pip install -q --no-deps tf_keras==2.15.1
	$(PY) -m pip install -q --no-deps -e training_image
	touch $@

# Horovod 0.28.1 over Gloo, compiled here (about 4 minutes), for the horovod strategy's tests and benchmarks:
# `lm` imports it only when that strategy runs (the demo trains with MWMS).
$(VENV)/.horovod: $(VENV)/.installed
	$(PY) -c "import horovod.tensorflow" 2>/dev/null || \
		$(HOROVOD_BUILD_ENV) $(PY) -m pip install -q --no-build-isolation --no-cache-dir horovod==0.28.1
	touch $@

$(VENV_TF_CURRENT)/.installed: training_image/requirements.txt
	test -x $(VENV_TF_CURRENT)/bin/python || $(PYTHON) -m venv $(VENV_TF_CURRENT)
	$(VENV_TF_CURRENT)/bin/python -m pip install -q --upgrade pip
	$(VENV_TF_CURRENT)/bin/python -m pip install -q tensorflow-cpu==2.21.0 tf_keras==2.21.0 \
		-r training_image/requirements.txt pytest==9.2.0
	touch $@

# Python 3.8 from pyenv (`pyenv prefix 3.8`, else its newest versions/3.8.*), or PYTHON38=/path/to/python3.8.
# tensorflow-cpu 2.6.5 is the CPU build of the image's TF 2.6; the image's own packages come from its lock.
PYTHON38 ?= $(shell p="$$(pyenv prefix 3.8 2>/dev/null | head -1)/bin/python3.8"; [ -x "$$p" ] || \
	p="$$(ls -d "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/3.8.*/bin/python3.8 2>/dev/null | sort -V | tail -1)"; \
	[ -x "$$p" ] || p="$$(command -v python3.8)"; echo "$$p")
$(VENV_TF26)/.installed: training_image/requirements/tf2.6.txt
	@[ -n "$(PYTHON38)" ] && "$(PYTHON38)" -c "import sys; assert sys.version_info[:2] == (3, 8)" 2>/dev/null || { \
		echo "$(VENV_TF26) needs Python 3.8 (the SMP image's): install it with 'pyenv install 3.8' (pyenv finds it)," \
		"or name one with 'make PYTHON38=/path/to/python3.8 ...'" >&2; exit 1; }
	test -x $(VENV_TF26)/bin/python || "$(PYTHON38)" -m venv $(VENV_TF26)
	$(VENV_TF26)/bin/python -m pip install -q tensorflow-cpu==2.6.5 keras==2.6.0 "numpy<1.20" "protobuf<3.21" \
		-r training_image/requirements/tf2.6.txt pytest==8.3.5 pytest-timeout==2.4.0
	touch $@

# transformers 4.46.3 (TF GPT-2 and PyTorch Llama on CPU: tests/hf and bench/hf_compare.py) needs
# tokenizers 0.20 while the project pins 0.23: .venv-hf holds only requirements-hf.txt (torch's CPU
# build and its requirements pinned there, as --no-deps installs nothing unpinned) and reads the rest
# of .venv (TF 2.15.1, numpy) through a .pth file that comes after its own site-packages.
$(VENV_HF)/.installed: $(VENV)/.installed requirements-hf.txt
	test -x $(VENV_HF)/bin/python || $(PY) -m venv $(VENV_HF)
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
		"$$($(VENV_HF)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz-lmstack-venv.pth"
	$(VENV_HF)/bin/python -m pip install -q --no-deps -r requirements-hf.txt
	touch $@

# MLflow (server and client) for tests/training/test_tracking.py: the full package brings pandas,
# scikit-learn, SQLAlchemy and a server, none of which the project's .venv needs. Installed with
# .venv's protobuf and numpy pins first; then, as .venv-hf, it reads the rest of .venv (TensorFlow)
# through a .pth file after its own site-packages, so `lm.training.train` runs there with mlflow importable.
$(VENV_MLFLOW)/.installed: $(VENV)/.installed
	test -x $(VENV_MLFLOW)/bin/python || $(PYTHON) -m venv $(VENV_MLFLOW)
	$(VENV_MLFLOW)/bin/python -m pip install -q mlflow==$(MLFLOW_VERSION) \
		"$$($(PY) -m pip freeze | grep -i '^protobuf==')" "$$($(PY) -m pip freeze | grep -i '^numpy==')"
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
		"$$($(VENV_MLFLOW)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz-lmstack-venv.pth"
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

test: setup
	$(PY) -m pytest

# What `python -m lmstack.demo` runs, and no more (not Horovod nor the other virtual environments of `setup`):
# .venv (the demo, the gate's SDK, the training toolkit and `lm` it starts) and node_modules (`npx cdk synth`). The gate's
# worker runs on a Python 3.13 found on PATH or through pyenv (lmstack.local_lambda.runtime_interpreter).
# A step that needs another environment adds its target here.
DEMO_PREREQUISITES := $(VENV)/.installed node_modules/.installed

demo: $(DEMO_PREREQUISITES)
	$(PY) -m lmstack.demo

synth: $(VENV)/.installed node_modules/.installed
	npx cdk synth --quiet

lint: $(VENV)/.installed
	$(PY) -m pytest tests/test_lint.py

bench: setup
	$(PY) bench/train_step.py --repeats 5
	$(PY) bench/prepare.py --repeats 2 --text-bytes 33554432
	$(PY) bench/input_pipeline.py --mib 256
	$(PY) bench/generate.py
	$(PY) bench/eval.py

clean:
	rm -rf cdk.out demo-output .pytest_cache
