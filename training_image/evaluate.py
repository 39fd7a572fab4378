"""The program of the evaluate stage's job (`sagemaker_program = evaluate.py`, current-TF image only): `lm.eval.stage`."""
import sys

from lm.eval.stage import main

if __name__ == "__main__":
    sys.exit(main())
