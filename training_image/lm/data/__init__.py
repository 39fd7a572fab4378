"""Data: raw Pile files to tokenized shards (`prepare`, `pile`, `tokenizer`), and shards to
training batches (`dataset`)."""
