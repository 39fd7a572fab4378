"""The program the SageMaker training toolkit runs (SAGEMAKER_PROGRAM=train.py): `lm.training.train`."""
import sys

from lm.training.train import main

if __name__ == "__main__":
    sys.exit(main())
