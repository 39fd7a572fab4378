"""lm-eval's own command line with lmstack's model registered:

    python -m lm.eval.harness --model lmstack --model_args pretrained=DIR --tasks ... [any lm_eval option]

is `lm_eval --model lmstack ...` (lm-eval finds a model outside its package only once the module
registering it is imported; this imports it first).
"""
from lm.eval.model import model_class


def main():
    model_class()
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
