import pytest

from rcllm.errors import RcllmError
from rcllm.eval.datasets import load_dataset

BROKEN_TITLE = '<span class="a-size-medium a-color-secondary"'


def _review(user, item, t, rating=5.0, text="good", **extra):
    return {"reviewerID": user, "asin": item, "overall": rating, "reviewText": text,
            "summary": "sum", "unixReviewTime": t, **extra}


@pytest.fixture
def amazon2018_dir(tmp_path, jsonl):
    reviews = [
        _review("u1", "A", 100, text="first <b>great</b> read"),
        _review("u1", "B", 200),
        _review("u1", "B", 200),                     # exact duplicate line
        _review("u1", "C", 200, rating=2.0),         # same time as B: file order breaks the tie
        _review("u1", "B", 300, text="again"),       # second review of (u1, B)
        _review("u2", "A", 50, text=""),             # empty text -> summary
        _review("u2", "X", 60),                      # X has no metadata
        {"reviewerID": "u2", "asin": "C", "reviewText": "no rating", "unixReviewTime": 70},
        _review("u2", "C", "soon"),                  # bad time
    ]
    jsonl(tmp_path / "Magazine_Subscriptions_5.json", reviews)
    meta = [
        {"asin": "A", "title": BROKEN_TITLE, "brand": "Reason Magazine",
         "description": ["REASON is edited for people interested in liberty. More text."],
         "category": ["Magazine Subscriptions", "News &amp; Politics"]},
        {"asin": "A", "title": BROKEN_TITLE, "brand": "dup row"},
        {"asin": "B", "title": "Bee Weekly", "description": [], "feature": ["Weekly news"],
         "main_cat": "Magazine Subscriptions"},
        {"asin": "C", "title": "", "description": ["<br>Cats and more cats.</br>"]},
        {"asin": "D", "title": "Unused"},
        {"title": "no asin"},
    ]
    jsonl(tmp_path / "meta_Magazine_Subscriptions.json.gz", meta, gz=True)
    return tmp_path


def test_amazon2018_mapping_dedupe_and_skips(amazon2018_dir):
    ds = load_dataset(str(amazon2018_dir), "amazon2018", category="Magazine_Subscriptions")
    ds.check_invariants()
    assert ds.name == "amazon2018-Magazine_Subscriptions"
    assert [h.item_id for h in ds.users["u1"]] == ["A", "B", "C"]
    assert ds.users["u1"][0].review == "first great read"
    assert [h.review for h in ds.users["u2"]] == ["sum"]
    assert ds.skipped == {"duplicate_item_metadata": 1, "duplicate_line": 1,
                          "duplicate_user_item": 1, "item_without_interactions": 1,
                          "missing_field:asin": 1, "missing_field:overall": 1,
                          "bad_value:unixReviewTime": 1, "unknown_item": 1}
    a, b, c = ds.items["A"], ds.items["B"], ds.items["C"]
    assert a.title == "Reason Magazine — REASON is edited for people interested in liberty."
    assert a.category == "Magazine Subscriptions > News & Politics"
    assert a.description.startswith("REASON is edited")
    assert (b.title, b.description, b.category) == ("Bee Weekly", "Weekly news",
                                                    "Magazine Subscriptions")
    assert c.title == "Cats and more cats." and c.description == "Cats and more cats."


def test_amazon2018_review_file_path_and_options(amazon2018_dir):
    review_file = amazon2018_dir / "Magazine_Subscriptions_5.json"
    ds = load_dataset(str(review_file), "amazon2018", max_description_words=2, max_lines=2)
    assert sum(len(h) for h in ds.users.values()) == 2
    assert ds.items["A"].description == "REASON is …"
    ds = load_dataset(str(review_file), "amazon2018", keep_unused_items=True)
    assert "D" in ds.items and "item_without_interactions" not in ds.skipped


def test_amazon2018_path_errors(amazon2018_dir, tmp_path):
    with pytest.raises(RcllmError, match="category"):
        load_dataset(str(amazon2018_dir), "amazon2018")
    with pytest.raises(RcllmError, match="not found"):
        load_dataset(str(tmp_path / "nope"), "amazon2018")
    with pytest.raises(RcllmError, match="Gift_Cards review file not found"):
        load_dataset(str(amazon2018_dir), "amazon2018", category="Gift_Cards")
    (amazon2018_dir / "meta_Magazine_Subscriptions.json.gz").unlink()
    with pytest.raises(RcllmError, match="metadata for Magazine_Subscriptions not found"):
        load_dataset(str(amazon2018_dir), "amazon2018", category="Magazine_Subscriptions")


def test_amazon2023(tmp_path, jsonl):
    jsonl(tmp_path / "All_Beauty.jsonl", [
        {"rating": 4.0, "title": "Nice", "text": "Smells <i>lovely</i>", "asin": "a1",
         "parent_asin": "P1", "user_id": "U", "timestamp": 1588687728923,
         "helpful_vote": 0, "verified_purchase": True, "images": []},
        {"rating": 2, "title": "Meh title only", "text": "", "asin": "a2", "parent_asin": "P2",
         "user_id": "U", "timestamp": 1588687728000},
        {"rating": 5, "text": "x", "asin": "a3", "user_id": "V", "timestamp": 1},
        {"rating": 5, "text": "y", "parent_asin": "P1", "timestamp": 1},
    ])
    jsonl(tmp_path / "meta_All_Beauty.jsonl.gz", [
        {"parent_asin": "P1", "title": "Rose Oil", "main_category": "All Beauty",
         "description": [], "features": ["Pure rose", "Glass bottle"], "categories": []},
        {"parent_asin": "P2", "title": "", "store": "Acme", "description": ["Soft brush. Big."],
         "categories": ["Beauty", "Tools", "Beauty"]},
    ], gz=True)
    ds = load_dataset(str(tmp_path), "amazon2023", category="All_Beauty")
    ds.check_invariants()
    hist = ds.users["U"]
    assert [h.item_id for h in hist] == ["P1", "P2"]  # same second: file order breaks the tie
    assert hist[0].timestamp == hist[1].timestamp == 1588687728
    assert hist[0].review == "Smells lovely" and hist[1].review == "Meh title only"
    assert ds.items["P1"].description == "Pure rose Glass bottle"
    assert ds.items["P1"].category == "All Beauty"
    assert ds.items["P2"].title == "Acme — Soft brush." and ds.items["P2"].category == "Beauty > Tools"
    assert ds.skipped == {"missing_field:user_id": 1, "unknown_item": 1}


def test_real_amazon2018(shared_data):
    folder = shared_data / "amazon2018"
    mag = load_dataset(str(folder), "amazon2018", category="Magazine_Subscriptions")
    mag.check_invariants()
    assert (len(mag.users), len(mag.items)) == (348, 151)
    # 2,375 lines - duplicates = 2,302 distinct (user, item) pairs (PROVENANCE.md)
    assert 2375 - mag.skipped["duplicate_line"] - mag.skipped["duplicate_user_item"] == 2302
    assert mag.skipped["unknown_item"] == 2302 - sum(len(h) for h in mag.users.values())
    assert sum("<span" in i.title for i in mag.items.values()) == 0
    gift = load_dataset(str(folder / "Gift_Cards_5.json"), "amazon2018")
    assert (len(gift.users), len(gift.items)) == (458, 148)
    assert sum(len(h) for h in gift.users.values()) == 2965
