"""Reading Pile files: bad records counted by kind, good ones kept; the sample corpus; input checks."""
import json
import os

import pytest
import zstandard
from tokenizers import Tokenizer

from prepare_helpers import split_tokens
from lm.data import pile
from lm.data import prepare
from lmstack import sample_corpus
from lm.spec import shards


def good(index):
    return json.dumps({"text": "good document %d: %s" % (index, "lorem ipsum " * (index % 7 + 1)),
                       "meta": {"pile_set_name": "Pile-CC" if index % 2 else "Github"}}).encode("utf-8")


BAD_LINES = [
    (b'{"text": "unterminated', "invalid_json"),
    (b"not json at all", "invalid_json"),
    (b'{"meta": {"pile_set_name": "Pile-CC"}}', "missing_text"),
    (b'{"text": 42}', "missing_text"),
    (b'["a", "list"]', "missing_text"),
    (b'{"text": "caf\xe9 latin-1"}', "non_utf8"),
    (b'{"text": "lone surrogate \\ud800"}', "non_utf8"),
    (b'{"text": ""}', "empty"),
    (b'{"text": "  \\n\\t "}', "empty"),
]


def bad_file(path):
    """Frame 1: good records with every kind of bad one between them. Frame 2: good records, cut short.

    Returns the good records of frame 1 and of frame 2, in order.
    """
    lines, first = [], []
    for index, (line, _) in enumerate(BAD_LINES):
        lines += [good(index), line, b""]  # blank lines are not records
        first.append(good(index))
    lines.append(good(100))
    first.append(good(100))
    second = [good(1000 + index) for index in range(4000)]
    frame1 = zstandard.ZstdCompressor(level=3).compress(b"\n".join(lines) + b"\n")
    frame2 = zstandard.ZstdCompressor(level=3).compress(b"\n".join(second) + b"\n")
    with open(path, "wb") as handle:
        handle.write(frame1 + frame2[:len(frame2) * 3 // 4])
    return first, second


def texts(lines):
    return [json.loads(line)["text"] for line in lines]


def test_reader_counts_every_kind_and_keeps_good_records_around_bad_ones(tmp_path):
    path = str(tmp_path / "bad.jsonl.zst")
    first, second = bad_file(path)
    reader = pile.Reader(path, chunk_bytes=4096)
    documents = list(reader.documents())
    expected_counts = {kind: sum(1 for _, k in BAD_LINES if k == kind) for kind in pile.REJECT_KINDS}
    expected_counts["truncated"] = 1
    assert {kind: reader.rejected[kind] for kind in pile.REJECT_KINDS} == expected_counts
    got = [text for text, _, _ in documents]
    assert got[:len(first)] == texts(first)
    kept = got[len(first):]
    assert 0 < len(kept) < len(second) and kept == texts(second)[:len(kept)]
    assert [source for _, _, source in documents[:2]] == ["Github", "Pile-CC"]
    assert all(data == text.encode("utf-8") for text, data, _ in documents)


def test_plain_jsonl_without_final_newline_and_missing_meta(tmp_path):
    path = tmp_path / "plain.jsonl"
    path.write_bytes(b'{"text": "one"}\n{"text": "two", "meta": "odd"}\n{"text": "three"}')
    reader = pile.Reader(str(path))
    assert list(reader.documents()) == [("one", b"one", "unknown"), ("two", b"two", "unknown"),
                                        ("three", b"three", "unknown")]
    assert sum(reader.rejected.values()) == 0


def test_a_corrupt_stream_is_counted_and_what_came_before_is_kept(tmp_path):
    path = tmp_path / "corrupt.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "kept"}\n') + b"\x28\xb5\x2f\xfd garbage" * 10)
    reader = pile.Reader(str(path))
    assert [text for text, _, _ in reader.documents()] == ["kept"]
    assert reader.rejected["truncated"] == 1


def test_prepare_reports_bad_input_per_file_and_kind(tokenizer_file, tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    first, second = bad_file(str(raw / "bad.jsonl.zst"))
    sample_corpus.write_file(str(raw / "clean.jsonl"), [{"text": "a clean document"}] * 3)
    output = str(tmp_path / "out")
    assert prepare.main([str(raw), "--output", output, "--tokenizer", tokenizer_file, "--seq-len", "32",
                         "--val-fraction", "0", "--workers", "1", "--threads", "1"]) == 0
    manifest = shards.load_manifest(output)
    bad = manifest.inputs["bad"]
    for kind in pile.REJECT_KINDS:
        assert bad["rejected"][kind] == (1 if kind == "truncated" else sum(1 for _, k in BAD_LINES if k == kind))
    assert sum(manifest.inputs["clean"]["rejected"].values()) == 0
    tokenizer = Tokenizer.from_file(tokenizer_file)
    tokens = split_tokens(output, "bad", "train").tolist()
    eod = manifest.eod_token_id
    segments, current = [], []
    for token in tokens:
        if token == eod:
            segments.append(tokenizer.decode(current))
            current = []
        else:
            current.append(token)
    assert segments[:len(first)] == texts(first)
    assert segments[len(first):] == texts(second)[:len(segments) - len(first)]
    assert bad["documents"] == len(list(pile.Reader(str(raw / "bad.jsonl.zst")).documents())) > len(first)
    table = capsys.readouterr().out
    assert "invalid_json=2, missing_text=3, non_utf8=2, empty=2, truncated=1" in table
    assert "clean.jsonl" in table and "none" in table


def test_unusable_paths_are_refused_before_any_work(tmp_path, tokenizer_file, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    output = tmp_path / "out"
    cases = [([str(tmp_path / "missing.jsonl.zst")], "missing.jsonl.zst: no such file or directory"),
             ([str(empty)], "directory holds no"), ([str(tmp_path / "notes.txt")], "not an input file")]
    for inputs, message in cases:
        assert prepare.main(inputs + ["--output", str(output), "--tokenizer", tokenizer_file]) == 2
        assert message in capsys.readouterr().err
        assert not output.exists()


def test_inputs_that_would_share_a_name_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    sample_corpus.write_file(str(tmp_path / "a" / "00.jsonl"), [{"text": "x"}])
    sample_corpus.write_file(str(tmp_path / "b" / "00.jsonl.zst"), [{"text": "y"}])
    with pytest.raises(pile.InputError, match="would both be named '00'"):
        pile.find_inputs([str(tmp_path / "a"), str(tmp_path / "b")])
    found = pile.find_inputs([str(tmp_path)])
    assert [(item.name, item.key) for item in found] == [("a/00.jsonl", "a--00"), ("b/00.jsonl.zst", "b--00")]


def test_sample_corpus_pieces_are_cut_at_line_ends_and_blank_ones_dropped():
    text = "a" * 5 + "\n" + "b" * 3 + "\n\n" + "c" * 12 + "\n" + "d"
    # the lone "\n" between the second and third piece is a blank piece
    assert sample_corpus.pieces(text, limit=10) == ["aaaaa\nbbb\n", "c" * 12 + "\n", "d"]
    assert sample_corpus.pieces(text, limit=100) == [text]


def test_sample_corpus_is_deterministic_and_pile_shaped(tmp_path):
    one = sample_corpus.write_sample_corpus(str(tmp_path / "one.jsonl.zst"), max_bytes=200000)
    two = sample_corpus.write_sample_corpus(str(tmp_path / "two.jsonl.zst"), max_bytes=200000)
    with open(one[0], "rb") as a, open(two[0], "rb") as b:
        assert a.read() == b.read()
    documents = [record for record, _, _ in pile.Reader(one[0]).documents()]
    records = sample_corpus.sample_documents(200000)
    assert documents == [record["text"] for record in records]
    assert 150000 < sum(len(text.encode("utf-8")) for text in documents) <= 200000
    # the two sources in equal shares, in pieces cut at line ends
    shares = {"Pile-CC": 0, "Github": 0}
    for record in records:
        shares[record["meta"]["pile_set_name"]] += len(record["text"].encode("utf-8"))
    assert abs(shares["Pile-CC"] - shares["Github"]) <= sample_corpus.PIECE_BYTES, shares
    assert max(len(text.encode("utf-8")) for text in documents) <= sample_corpus.PIECE_BYTES
    split = sample_corpus.write_sample_corpus(str(tmp_path / "split"), max_bytes=200000, files=3)
    assert [os.path.basename(path) for path in split] == ["00.jsonl.zst", "01.jsonl.zst", "02.jsonl.zst"]
    dealt = [[text for text, _, _ in pile.Reader(path).documents()] for path in split]
    assert sorted(sum(dealt, [])) == sorted(documents) and dealt[1] == documents[1::3]
    assert sample_corpus.main([str(tmp_path / "cli.jsonl"), "--max-bytes", "5000"]) == 0
    assert os.path.getsize(str(tmp_path / "cli.jsonl")) > 0
