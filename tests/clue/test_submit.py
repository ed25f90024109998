"""`keras-masking clue submit`: every run's submission file checked, then zipped.

The zip of real runs (one per task kind) is tested in tests/clue/test_runner.py.
"""

import json
import os
import zipfile

import pytest

from keras_masking.cli import main
from keras_masking.clue.submit import submit
from tests.clue import fixtures as clue_fixtures


@pytest.mark.parametrize(
    "date", ["20261340", "20260229", "2026121", "２０２６１２０１", "20261201 "]
)
def test_submit_refuses_a_date_that_is_not_a_day(date, tmp_path, capsys):
    assert main(["clue", "submit", str(tmp_path), "--team", "lab", "--date", date]) == 2
    assert f"Received: date={date!r}" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"Expected date as YYYYMMDD"):
        submit(tmp_path, team="lab", date=date)
    assert os.listdir(tmp_path) == []


def test_submit_zips_clue_1_0s_file_beside_1_1s(tmp_path):
    # A finished TNEWS run whose data folder holds both test files: CLUE's
    # baselines submit both, and each is checked against its own test file.
    data = tmp_path / "data" / "tnews"
    clue_fixtures.write_lines(data / "test1.0.json", [{"id": 7, "sentence": "好"}])
    clue_fixtures.write_lines(data / "test1.1.json", [{"id": 0, "sentence": "不好"}])
    run = tmp_path / "runs" / "tnews"
    run.mkdir(parents=True)
    (run / "tnews11_predict.json").write_text('{"id": 0, "label": "100"}\n', encoding="utf-8")
    (run / "tnews10_predict.json").write_text('{"id": 7, "label": "101"}\n', encoding="utf-8")
    record = {
        "status": "finished",
        "arguments": {"task": "tnews", "benchmark": "clue", "data_dir": str(tmp_path / "data")},
        "submission": "tnews11_predict.json",
        "submission_1.0": "tnews10_predict.json",
    }
    (run / "run.json").write_text(json.dumps(record), encoding="utf-8")
    archive, files = submit(tmp_path / "runs", team="lab", date="20261201")
    with zipfile.ZipFile(archive) as opened:
        assert sorted(opened.namelist()) == ["tnews10_predict.json", "tnews11_predict.json"]
    # The 1.0 file is checked against test1.0.json: an id from 1.1 is refused.
    archive.unlink()
    (run / "tnews10_predict.json").write_text('{"id": 0, "label": "101"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="tnews10_predict.json"):
        submit(tmp_path / "runs", team="lab", date="20261201")
