"""The evaluation job's program (`lm.eval.stage`, training_image/evaluate.py) on what SageMaker hands it: the model
channel's model.tar.gz, the task entries as the request joins them, the score lines its MetricDefinitions read.
`make demo` runs it whole through the SageMaker training toolkit (tests/demo/test_demo.py)."""
import json
import os
import tarfile

import pytest

from controlplane import metrics
from lm.eval import stage
from lm.spec import evaluation


def _archive(directory, files):
    os.makedirs(directory, exist_ok=True)
    with tarfile.open(os.path.join(directory, stage.MODEL_ARCHIVE), "w:gz") as archive:
        for name, text in files.items():
            path = os.path.join(directory, "_" + name)
            with open(path, "w") as handle:
                handle.write(text)
            archive.add(path, arcname=name)
            os.remove(path)


def test_the_model_channel_s_archive_is_extracted_with_its_files_at_the_top(tmp_path):
    _archive(str(tmp_path / "model"), {"model.json": "{}", "weights.npz": "w"})
    into = stage.extract_model(str(tmp_path / "model"), str(tmp_path / "extracted"))
    assert sorted(os.listdir(into)) == ["model.json", "weights.npz"]


def test_a_model_channel_without_one_archive_stops_the_job_naming_it(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="the model channel must hold one model.tar.gz, found 0"):
        stage.extract_model(str(tmp_path / "empty"), str(tmp_path / "x"))


def test_task_entries_are_names_or_files_of_the_tasks_channel(tmp_path):
    entries = stage.task_entries("arc_easy,mine.yaml", str(tmp_path))
    assert entries == [("arc_easy", "arc_easy"), ("mine.yaml", str(tmp_path / "mine.yaml"))]
    assert stage.task_entries("", None) == []
    with pytest.raises(SystemExit, match="need the tasks channel"):
        stage.task_entries("arc_easy", None)


def test_each_entry_s_score_line_is_its_task_s_first_metric_under_the_entry_s_name(tmp_path):
    (tmp_path / "mine.yaml").write_text(json.dumps({"task": "my_task", "dataset_path": "json"}))
    entries = stage.task_entries("arc_easy,mine.yaml", str(tmp_path))
    headline = {"arc_easy/acc": 0.5, "arc_easy/acc_norm": 0.6, "my_task/exact_match": 0.25,
                "pile_bpb/Github": 1.5, "pile_bpb/total": 1.25}
    found = stage.scores(entries, headline)
    assert found == [("arc_easy", "acc", 0.5), ("mine.yaml", "exact_match", 0.25),
                     (evaluation.PILE_BPB_LABEL, "bits_per_byte", 1.25)]
    definitions = metrics.evaluation_definitions([evaluation.PILE_BPB_LABEL, "arc_easy", "mine.yaml"])
    read = {}
    for line in (evaluation.format_score_log(*score) for score in found):
        read.update(metrics.parse_metrics(line, definitions))
    assert read == {"evaluation:arc_easy": 0.5, "evaluation:mine.yaml": 0.25, "evaluation:pile_bpb": 1.25}
