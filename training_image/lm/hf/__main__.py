"""`python -m lm.hf`: convert between our export (`lm.serving.export`) and a Hugging Face directory."""
import argparse
import os

from lm.hf import export_hf, import_hf


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m lm.hf",
        description="Convert exports: --format hf EXPORT_DIR OUTPUT_DIR writes a Hugging Face directory "
                    "(the layout of the model's family: GPT-2 or Llama); --from-hf HF_DIR EXPORT_DIR reads one "
                    "into this format.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--format", choices=["hf"], help="write EXPORT_DIR (an lm.serving.export directory) as OUTPUT_DIR")
    mode.add_argument("--from-hf", action="store_true", help="read a Hugging Face directory (GPT-2 or Llama) into EXPORT_DIR")
    parser.add_argument("source", help="EXPORT_DIR (--format) or HF_DIR (--from-hf)")
    parser.add_argument("destination", help="OUTPUT_DIR (--format) or EXPORT_DIR (--from-hf)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.source):
        parser.error("source %s: not a directory" % args.source)
    try:
        if args.from_hf:
            import_hf(args.source, args.destination)
        else:
            export_hf(args.source, args.destination)
    except ValueError as error:
        parser.exit(1, "python -m lm.hf: error: %s\n" % error)
    print(args.destination)


if __name__ == "__main__":
    main()
