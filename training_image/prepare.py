"""Entry point of the "prepare" SageMaker job (`sagemaker_program = prepare.py`): see `lm.data.prepare`.

Inputs come from the raw channel, the dataset goes to the EFS channel mounted read-write;
hyperparameters arrive as `--name value` arguments.
"""
import sys

from lm.data.prepare import main

if __name__ == "__main__":
    sys.exit(main())
