"""The program the SageMaker training toolkit runs (SAGEMAKER_PROGRAM=train.py): `lm.train`."""
import sys

from lm.train import main

if __name__ == "__main__":
    sys.exit(main())
