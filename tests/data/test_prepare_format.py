"""lm.data.prepare output: round trip, record layout, dtype, workers, settings checks, multi-instance merge."""
import json
import os

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from prepare_helpers import split_tokens, tree_bytes
from lm.data import prepare
from lmstack import sample_corpus
from lm.spec import shards

SEQ_LEN = 64
VAL_FRACTION = 0.2


def run(inputs, output, tokenizer_file, *extra):
    argv = list(inputs) + ["--output", output, "--tokenizer", tokenizer_file, "--seq-len", str(SEQ_LEN),
                           "--shard-size", "8KiB", "--val-fraction", str(VAL_FRACTION), "--threads", "1"]
    return prepare.main(argv + [str(arg) for arg in extra])


def expected_streams(records, tokenizer, eod):
    """Token stream per split built independently: each document's ids, then the EOD token."""
    threshold = prepare.val_threshold(VAL_FRACTION)
    streams = {split: [] for split in shards.SPLITS}
    texts = {split: [] for split in shards.SPLITS}
    for record in records:
        split = "val" if prepare.is_val(record["text"].encode("utf-8"), threshold) else "train"
        streams[split].extend(tokenizer.encode(record["text"], add_special_tokens=False).ids + [eod])
        texts[split].append(record["text"])
    return streams, texts


def test_round_trip_gives_back_the_documents_in_order(corpus, tokenizer_file, tmp_path):
    raw, records = corpus
    output = str(tmp_path / "out")
    assert run([raw], output, tokenizer_file, "--workers", "1") == 0
    manifest = shards.load_manifest(output)
    tokenizer = Tokenizer.from_file(os.path.join(output, manifest.tokenizer_file))
    eod = manifest.eod_token_id
    assert tokenizer.id_to_token(eod) == "<|endoftext|>"
    record_tokens = SEQ_LEN + 1
    for name, file_records in records.items():
        key = name[:-len(".jsonl.zst")]
        streams, texts = expected_streams(file_records, tokenizer, eod)
        dropped = 0
        for split in shards.SPLITS:
            tokens = split_tokens(output, key, split)
            whole = len(streams[split]) // record_tokens * record_tokens
            assert tokens.tolist() == streams[split][:whole]
            dropped += len(streams[split]) - whole
            segments = np.split(tokens, np.flatnonzero(tokens == eod) + 1)
            decoded = [tokenizer.decode(segment[:-1].tolist(), skip_special_tokens=False) for segment in segments[:-1]]
            assert decoded == texts[split][:len(decoded)]
            assert len(texts[split]) - len(decoded) <= 1 + record_tokens  # only the dropped tail is missing
        entry = manifest.inputs[key]
        assert entry["dropped_tokens"] == dropped
        assert entry["documents"] == len(file_records)
        assert entry["tokens"] == sum(len(stream) for stream in streams.values())
    assert manifest.records("train") > 0 and manifest.records("val") > 0


def test_the_validation_documents_are_kept_with_their_source_and_counted(corpus, tokenizer_file, tmp_path):
    raw, records = corpus
    output = str(tmp_path / "out")
    assert run([raw], output, tokenizer_file, "--workers", "2") == 0
    manifest = shards.load_manifest(output)
    tokenizer = Tokenizer.from_file(tokenizer_file)
    expected_sources = {}
    for name, file_records in sorted(records.items()):
        key = name[:-len(".jsonl.zst")]
        path = os.path.join(output, shards.val_documents_name(key))
        with open(path, encoding="utf-8") as handle:
            kept = [json.loads(line) for line in handle]
        _, texts = expected_streams(file_records, tokenizer, manifest.eod_token_id)
        assert [document["text"] for document in kept] == texts["val"] and texts["val"]
        wanted = [record["meta"]["pile_set_name"] for record in file_records if record["text"] in texts["val"]]
        assert [document["meta"]["pile_set_name"] for document in kept] == wanted
        assert manifest.val_documents[shards.val_documents_name(key)]["documents"] == len(kept)
        assert manifest.val_documents[shards.val_documents_name(key)]["bytes"] == os.path.getsize(path)
        for document in kept:
            counts = expected_sources.setdefault(document["meta"]["pile_set_name"], {"documents": 0, "text_bytes": 0})
            counts["documents"] += 1
            counts["text_bytes"] += len(document["text"].encode("utf-8"))
    assert manifest.val_sources == expected_sources and len(expected_sources) > 1
    assert shards.val_documents_files(output) == [os.path.join(output, path) for path in sorted(manifest.val_documents)]
    assert not [name for name in os.listdir(os.path.join(output, shards.VAL_DOCUMENTS_DIR)) if ".tmp-" in name]
    assert prepare.main(["verify", output]) == 0
    with open(shards.val_documents_files(output)[0], "a") as handle:
        handle.write("\n")
    assert prepare.main(["verify", output]) != 0


def test_record_layout_and_manifest_match_the_files(corpus, tokenizer_file, tmp_path):
    raw, records = corpus
    output = str(tmp_path / "out")
    assert run([raw], output, tokenizer_file, "--workers", "1") == 0
    manifest = shards.load_manifest(output)
    assert manifest.dtype == "uint16" and manifest.seq_len == SEQ_LEN
    assert manifest.vocab_size == Tokenizer.from_file(tokenizer_file).get_vocab_size()
    assert manifest.tokenizer_sha256 == shards.sha256_file(tokenizer_file)
    assert manifest.tokenizer_sha256 == shards.sha256_file(os.path.join(output, manifest.tokenizer_file))
    record_bytes = (SEQ_LEN + 1) * 2
    per_shard = manifest.prepare["records_per_shard"]
    assert per_shard == 8192 // record_bytes
    listed = set()
    for shard in manifest.shards:
        path = os.path.join(output, shard.path)
        size = os.path.getsize(path)
        assert size % record_bytes == 0 and size == shard.bytes == shard.records * record_bytes
        assert 1 <= shard.records <= per_shard
        assert shards.sha256_file(path) == shard.sha256
        listed.add(shard.path)
    on_disk = {"%s/%s" % (split, name) for split in shards.SPLITS for name in os.listdir(os.path.join(output, split))}
    assert on_disk == listed
    assert shards.verify(output, manifest) == []
    sources = {}
    for entry in manifest.inputs.values():
        assert entry["tokens"] == sum(counts["tokens"] for counts in entry["sources"].values())
        for name, counts in entry["sources"].items():
            sources[name] = sources.get(name, 0) + counts["documents"]
    labelled = {}
    for file_records in records.values():
        for record in file_records:
            labelled[record["meta"]["pile_set_name"]] = labelled.get(record["meta"]["pile_set_name"], 0) + 1
    assert sources == labelled == {name: counts["documents"] for name, counts in manifest.sources.items()}
    written = sum(shard.records for shard in manifest.shards) * (SEQ_LEN + 1)
    assert written + sum(entry["dropped_tokens"] for entry in manifest.inputs.values()) == \
        sum(entry["tokens"] for entry in manifest.inputs.values())
    # the check can fail: one flipped byte
    with open(os.path.join(output, manifest.shards[0].path), "r+b") as handle:
        first = handle.read(1)
        handle.seek(0)
        handle.write(bytes([first[0] ^ 1]))
    problems = shards.verify(output, manifest)
    assert len(problems) == 1 and manifest.shards[0].path in problems[0] and "sha256" in problems[0]
    shards.check(output, manifest)  # the start-up check reads sizes only: a flipped byte passes it


def test_large_vocabulary_is_written_as_uint32(tmp_path):
    words = ["w%d" % index for index in range(70000)]
    vocab = {word: index for index, word in enumerate(["<|endoftext|>", "[UNK]"] + words)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer_file = str(tmp_path / "words.json")
    tokenizer.save(tokenizer_file)
    texts = [" ".join(words[(start * 997 + step * 7919) % 70000] for step in range(50)) for start in range(40)]
    raw = str(tmp_path / "words.jsonl")
    sample_corpus.write_file(raw, [{"text": text} for text in texts])
    output = str(tmp_path / "out")
    assert prepare.main([raw, "--output", output, "--tokenizer", tokenizer_file, "--seq-len", "16",
                         "--val-fraction", "0", "--workers", "1", "--threads", "1"]) == 0
    manifest = shards.load_manifest(output)
    assert manifest.dtype == "uint32" and manifest.record_bytes == 17 * 4
    tokens = split_tokens(output, "words", "train")
    expected = []
    for text in texts:
        expected.extend(vocab[word] for word in text.split())
        expected.append(0)
    assert tokens.tolist() == expected[:len(tokens)] and tokens.max() > 65535
    assert manifest.sources == {"unknown": {"documents": 40, "tokens": len(expected), "text_bytes": sum(
        len(text) for text in texts)}}


@pytest.mark.slow
def test_two_workers_write_the_same_bytes_as_one(tokenizer_file, tmp_path):
    raw = str(tmp_path / "raw")
    sample_corpus.write_sample_corpus(raw, max_bytes=300000, files=4)
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    assert run([raw], one, tokenizer_file, "--workers", "1") == 0
    assert run([raw], two, tokenizer_file, "--workers", "2") == 0
    # Each input file has its own shards, so even the shard boundaries are the same.
    assert tree_bytes(one) == tree_bytes(two)
    assert len(shards.load_manifest(two).inputs) == 4


def test_rerun_with_other_settings_is_refused_before_any_work(corpus, tokenizer_file, tmp_path, capsys):
    raw, _ = corpus
    output = str(tmp_path / "out")
    assert run([raw], output, tokenizer_file, "--workers", "1") == 0
    before = tree_bytes(output)
    capsys.readouterr()
    assert run([raw], output, tokenizer_file, "--seq-len", "32") == 2
    assert "seq_len=64" in capsys.readouterr().err
    assert run([raw], output, tokenizer_file, "--val-fraction", "0.5") == 2
    assert "val_fraction=0.2" in capsys.readouterr().err
    other = str(tmp_path / "other.json")
    with open(tokenizer_file) as handle:
        values = json.load(handle)
    values["model"]["vocab"]["zzzz-extra"] = len(values["model"]["vocab"])
    with open(other, "w") as handle:
        json.dump(values, handle)
    assert run([raw], output, other) == 2
    assert "another tokenizer" in capsys.readouterr().err
    assert tree_bytes(output) == before
    # the same command again finds everything done and changes nothing
    assert run([raw], output, tokenizer_file, "--workers", "1") == 0
    assert "resuming: 2 of 2 inputs already done" in capsys.readouterr().out
    assert tree_bytes(output) == before


@pytest.mark.parametrize("argv, message", [
    (["--tokenizer", "TOKENIZER", "--train-tokenizer"], "exclude each other"),
    (["--tokenizer", "missing.json"], "missing.json: tokenizer file not found"),
    (["--tokenizer", "TOKENIZER", "--eod-token", "<eos>"], "no end-of-document token '<eos>'"),
])
def test_bad_tokenizer_arguments_are_clear_errors(corpus, tokenizer_file, tmp_path, capsys, argv, message):
    raw, _ = corpus
    argv = [tokenizer_file if arg == "TOKENIZER" else arg for arg in argv]
    assert prepare.main([raw, "--output", str(tmp_path / "out")] + argv) == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(str(tmp_path / "out" / shards.MANIFEST_NAME))


def test_out_of_range_setting_names_the_field(corpus, tokenizer_file, tmp_path, capsys):
    raw, _ = corpus
    with pytest.raises(SystemExit):
        run([raw], str(tmp_path / "out"), tokenizer_file, "--val-fraction", "1.5")
    assert "val_fraction must be between 0.0 and 1.0" in capsys.readouterr().err


def test_instances_split_the_inputs_and_the_last_one_merges(tokenizer_file, tmp_path, capsys):
    raw = str(tmp_path / "raw")
    sample_corpus.write_sample_corpus(raw, max_bytes=150000, files=3)
    single, shared = str(tmp_path / "single"), str(tmp_path / "shared")
    assert run([raw], single, tokenizer_file, "--workers", "1") == 0
    assert run([raw], shared, tokenizer_file, "--workers", "1", "--num-shards", "2", "--shard-index", "1") == 0
    assert not os.path.exists(os.path.join(shared, shards.MANIFEST_NAME))
    assert prepare.main(["merge", shared]) == 2
    assert "parts 0 of 2 are missing" in capsys.readouterr().err
    assert run([raw], shared, tokenizer_file, "--workers", "1", "--num-shards", "2", "--shard-index", "0") == 0
    merged, alone = shards.load_manifest(shared), shards.load_manifest(single)
    assert merged.prepare["complete"] and merged.inputs == alone.inputs and merged.shards == alone.shards
    assert merged.sources == alone.sources
    assert {path: data for path, data in tree_bytes(shared).items() if path.endswith(".bin")} == \
        {path: data for path, data in tree_bytes(single).items() if path.endswith(".bin")}
    part = json.loads(tree_bytes(shared)[prepare.part_name(0, 2)])
    assert sorted(part["inputs"]) == ["00", "02"]
    assert prepare.main(["merge", shared]) == 0 and shards.load_manifest(shared) == merged


def test_instance_position_comes_from_the_sagemaker_cluster(monkeypatch):
    monkeypatch.setenv("SM_HOSTS", json.dumps(["algo-1", "algo-2", "algo-3"]))
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-2")
    assert prepare.resolve_shard(-1, 0) == (1, 3)
    assert prepare.resolve_shard(0, 1) == (0, 1)
    with pytest.raises(prepare.PrepareError, match="shard_index 3 must be below num_shards 3"):
        prepare.resolve_shard(3, 0)
