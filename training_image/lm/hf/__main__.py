"""`python -m lm.hf`: convert between our export (`lm.serving.export`) and a Hugging Face directory."""
import argparse
import os

from lm.hf import DEFAULT_MAX_SHARD_SIZE, EXPORT_DTYPES, export_hf, import_hf


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
    parser.add_argument("--dtype", choices=list(EXPORT_DTYPES),
                        help="--format hf: the dtype of the weights written (default: as the family's models are "
                             "published: float32 for GPT-2, bfloat16 for Llama)")
    parser.add_argument("--max-shard-size", default=None,
                        help="--format hf: shard the weights above this size, as transformers' save_pretrained "
                             "(default %s; bytes or digits with KB, MB, GB, TB)" % DEFAULT_MAX_SHARD_SIZE)
    args = parser.parse_args(argv)
    if not os.path.isdir(args.source):
        parser.error("source %s: not a directory" % args.source)
    if args.from_hf and (args.dtype or args.max_shard_size):
        parser.error("--dtype and --max-shard-size apply to --format hf; --from-hf reads what the checkpoint holds")
    try:
        if args.from_hf:
            import_hf(args.source, args.destination)
        else:
            export_hf(args.source, args.destination, args.dtype, args.max_shard_size or DEFAULT_MAX_SHARD_SIZE)
    except ValueError as error:
        parser.exit(1, "python -m lm.hf: error: %s\n" % error)
    print(args.destination)


if __name__ == "__main__":
    main()
