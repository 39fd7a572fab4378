"""Byte-level BPE tokenizers (HF `tokenizers`): train one like GPT-NeoX did, or load a file.

A module of `lm` itself, below its subpackages: data preparation (`lm.data.prepare`), generation
(`lm.serving.generate`) and the Hugging Face files (`lm.hf`) all read it.
"""
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOD_TOKEN = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 50257


class TokenizerError(ValueError):
    """A tokenizer file that cannot be used; names the file."""


def train_bpe(texts, vocab_size=DEFAULT_VOCAB_SIZE, eod_token=EOD_TOKEN):
    """Train a byte-level BPE on an iterable of strings; the end-of-document token gets id 0.

    The vocabulary can come out smaller than `vocab_size` when the texts run out of merges.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[eod_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def load(path, eod_token=EOD_TOKEN):
    """Load a tokenizer JSON file and the id of its end-of-document token."""
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise TokenizerError("%s: tokenizer file not found or not readable" % path)
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as error:  # tokenizers raises a bare Exception for a bad file
        raise TokenizerError("%s: not a tokenizers JSON file: %s" % (path, error))
    return tokenizer, eod_id(tokenizer, eod_token, path)


def eod_id(tokenizer, eod_token=EOD_TOKEN, source="tokenizer"):
    token_id = tokenizer.token_to_id(eod_token)
    if token_id is None:
        raise TokenizerError("%s: has no end-of-document token %r (pass --eod-token)" % (source, eod_token))
    return token_id


def save(tokenizer, path):
    """Save under a temporary name, then rename."""
    tmp = "%s.tmp-%d" % (path, os.getpid())
    tokenizer.save(tmp)
    os.replace(tmp, path)
