"""Bad input files: a clear RcllmError naming file and line, or a counted skip — never silence."""

import json

import pytest

from rcllm.errors import RcllmError
from rcllm.eval.datasets import load_dataset

GOOD = {"reviewerID": "u", "asin": "A", "overall": 5.0, "reviewText": "ok",
        "unixReviewTime": 1}
META = {"asin": "A", "title": "Item A"}


def _amazon(tmp_path, jsonl, review_lines, meta_rows=(META,)):
    jsonl(tmp_path / "Cat_5.json", review_lines)
    jsonl(tmp_path / "meta_Cat.json", list(meta_rows))
    return tmp_path / "Cat_5.json"


def test_truncated_json_names_file_and_line(tmp_path, jsonl):
    path = _amazon(tmp_path, jsonl, [GOOD, json.dumps(GOOD)[:30]])
    with pytest.raises(RcllmError, match=r"Cat_5\.json:2: invalid JSON"):
        load_dataset(str(path), "amazon2018")
    ds = load_dataset(str(path), "amazon2018", on_error="skip")
    assert ds.skipped == {"bad_json": 1} and len(ds.users["u"]) == 1


def test_non_object_line(tmp_path, jsonl):
    path = _amazon(tmp_path, jsonl, [GOOD, "[1, 2]"])
    with pytest.raises(RcllmError, match=r"Cat_5\.json:2: expected a JSON object"):
        load_dataset(str(path), "amazon2018")
    assert load_dataset(str(path), "amazon2018", on_error="skip").skipped == {"not_an_object": 1}


def test_unknown_encoding_names_line(tmp_path, jsonl):
    path = _amazon(tmp_path, jsonl, [GOOD])
    with path.open("ab") as fh:
        fh.write('{"reviewerID": "v", "asin": "A", "reviewText": "café"}\n'.encode("latin-1"))
    with pytest.raises(RcllmError, match=r"Cat_5\.json:2: not UTF-8 \(byte 0xe9"):
        load_dataset(str(path), "amazon2018")
    assert load_dataset(str(path), "amazon2018", on_error="skip").skipped == {"bad_encoding": 1}


def test_corrupt_gzip(tmp_path, jsonl):
    jsonl(tmp_path / "Cat_5.json", [GOOD])
    good = jsonl(tmp_path / "tmp.json.gz", [META] * 200, gz=True).read_bytes()
    (tmp_path / "meta_Cat.json.gz").write_bytes(good[: len(good) // 2])
    with pytest.raises(RcllmError, match=r"meta_Cat\.json\.gz: cannot read"):
        load_dataset(str(tmp_path), "amazon2018", category="Cat")


def test_missing_fields_are_counted(tmp_path, jsonl):
    rows = [GOOD, {**GOOD, "reviewerID": ""}, {k: v for k, v in GOOD.items() if k != "asin"},
            {**GOOD, "reviewerID": "w", "overall": "five"}]
    ds = load_dataset(str(_amazon(tmp_path, jsonl, rows)), "amazon2018")
    assert ds.skipped == {"missing_field:reviewerID": 1, "missing_field:asin": 1,
                          "bad_value:overall": 1}


def test_missing_paths(tmp_path):
    for fmt in ("amazon2018", "amazon2023", "yelp", "goodreads", "movielens"):
        with pytest.raises(RcllmError, match="not found"):
            load_dataset(str(tmp_path / "missing"), fmt)
    with pytest.raises(RcllmError, match="Yelp review file not found"):
        load_dataset(str(tmp_path), "yelp")


def test_bad_options(tmp_path, jsonl):
    path = _amazon(tmp_path, jsonl, [GOOD])
    with pytest.raises(RcllmError, match="no option"):
        load_dataset(str(path), "amazon2018", genre="x")
    with pytest.raises(RcllmError, match="on_error"):
        load_dataset(str(path), "amazon2018", on_error="ignore")


def test_movielens_bad_rows(tmp_path):
    (tmp_path / "m.inter").write_text("user_id:token\titem_id:token\trating:float\t"
                                      "timestamp:float\n1\t10\t4\t5\n1\t10\t4\n", encoding="utf-8")
    (tmp_path / "m.item").write_text("item_id:token\tmovie_title:token_seq\n10\tHeat\n",
                                     encoding="utf-8")
    with pytest.raises(RcllmError, match=r"m\.inter:3: 3 cells, header has 4"):
        load_dataset(str(tmp_path), "movielens")
    assert load_dataset(str(tmp_path), "movielens", on_error="skip").skipped == {"bad_row": 1}
    (tmp_path / "m.item").write_text("item_id:token\ttitle:token_seq\n10\tHeat\n",
                                     encoding="utf-8")
    with pytest.raises(RcllmError, match=r"m\.item:1: header lacks movie_title"):
        load_dataset(str(tmp_path), "movielens")
    (tmp_path / "m.item").write_bytes("item_id:token\tmovie_title:token_seq\n10\tCafé\n"
                                      .encode("latin-1"))
    with pytest.raises(RcllmError, match=r"m\.item:2: not UTF-8"):
        load_dataset(str(tmp_path), "movielens")
