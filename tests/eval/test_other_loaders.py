import pytest

from rcllm.errors import RcllmError
from rcllm.eval.datasets import load_dataset


def test_yelp(tmp_path, jsonl):
    jsonl(tmp_path / "yelp_academic_dataset_review.json", [
        {"review_id": "r1", "user_id": "U", "business_id": "B1", "stars": 5, "text": "Great pizza",
         "date": "2016-03-09 00:00:00"},
        {"review_id": "r2", "user_id": "U", "business_id": "B2", "stars": 3.0, "text": "Okay",
         "date": "2015-01-01 12:00:00"},
        {"review_id": "r3", "user_id": "U", "business_id": "B1", "stars": 1, "text": "x",
         "date": "yesterday"},
        {"review_id": "r4", "business_id": "B1", "stars": 1, "text": "x", "date": "2015-01-01"},
    ])
    jsonl(tmp_path / "yelp_academic_dataset_business.json", [
        {"business_id": "B1", "name": "Pizza Place", "categories": "Restaurants, Pizza",
         "address": "1 Main St", "city": "Phoenix", "state": "AZ", "stars": 4.5},
        {"business_id": "B2", "name": "Cafe", "categories": None, "city": "Tempe"},
        {"business_id": "B3", "name": "Unused"},
        {"business_id": "B4"},
    ])
    ds = load_dataset(str(tmp_path), "yelp")
    ds.check_invariants()
    hist = ds.users["U"]
    assert [h.item_id for h in hist] == ["B2", "B1"]
    assert hist[0].timestamp == 1420113600 and hist[1].rating == 5.0
    b1 = ds.items["B1"]
    assert (b1.title, b1.category) == ("Pizza Place", "Restaurants, Pizza")
    assert b1.description == "Restaurants, Pizza. 1 Main St, Phoenix, AZ."
    assert ds.items["B2"].description == "Tempe."
    assert ds.skipped == {"bad_value:date": 1, "missing_field:user_id": 1,
                          "missing_field:name": 1, "item_without_interactions": 1}
    # the review file itself, with an explicit business file
    ds2 = load_dataset(str(tmp_path / "yelp_academic_dataset_review.json"), "yelp",
                       business_path=str(tmp_path / "yelp_academic_dataset_business.json"))
    assert ds2.users == ds.users
    with pytest.raises(RcllmError, match="business file not found"):
        load_dataset(str(tmp_path), "yelp", business_path=str(tmp_path / "none.json"))


def test_goodreads(tmp_path, jsonl):
    jsonl(tmp_path / "goodreads_reviews_poetry.json.gz", [
        {"user_id": "U", "book_id": "10", "review_id": "r1", "rating": 4,
         "review_text": "Lovely verses", "date_added": "Fri Aug 25 13:55:02 -0700 2017"},
        {"user_id": "U", "book_id": "11", "review_id": "r2", "rating": 0,
         "review_text": "", "date_added": "Mon Jan 02 00:00:00 +0000 2017"},
        {"user_id": "U", "book_id": "12", "rating": 3, "review_text": "x",
         "date_added": "2017-01-01"},
        {"user_id": "V", "book_id": "10", "review_text": "no rating",
         "date_added": "Mon Jan 02 00:00:00 +0000 2017"},
    ], gz=True)
    jsonl(tmp_path / "goodreads_books_poetry.json.gz", [
        {"book_id": "10", "title": "Leaves of Grass", "description": "Poems by Whitman.",
         "popular_shelves": [{"count": "9", "name": "to-read"}, {"count": "3", "name": "classics"},
                             {"count": "5", "name": "poetry"}], "authors": [{"author_id": "1"}]},
        {"book_id": "11", "title": "", "title_without_series": "Ariel", "description": None},
        {"book_id": "99", "title": "Unused"},
    ], gz=True)
    ds = load_dataset(str(tmp_path), "goodreads", genre="poetry")
    ds.check_invariants()
    hist = ds.users["U"]
    assert [h.item_id for h in hist] == ["11", "10"]
    assert hist[1].timestamp == 1503694502 and hist[0].rating == 0.0
    assert ds.items["10"].category == "poetry" and ds.items["11"].title == "Ariel"
    assert ds.skipped == {"bad_value:date_added": 1, "missing_field:rating": 1,
                          "item_without_interactions": 1}
    ds2 = load_dataset(str(tmp_path / "goodreads_reviews_poetry.json.gz"), "goodreads")
    assert ds2.items["10"].category == "poetry"  # most shelved non-status shelf
    assert ds2.items["11"].category == ""
    with pytest.raises(RcllmError, match="genre"):
        load_dataset(str(tmp_path), "goodreads")


def _write_ml(folder, inter_rows, item_rows):
    (folder / "ml-mini.inter").write_text(
        "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
        + "".join("\t".join(map(str, r)) + "\n" for r in inter_rows), encoding="utf-8")
    (folder / "ml-mini.item").write_text(
        "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
        + "".join("\t".join(map(str, r)) + "\n" for r in item_rows), encoding="utf-8")


def test_movielens(tmp_path):
    _write_ml(tmp_path, [(1, 10, 4, 881250949), (1, 11, 5, 881250900), (1, 267, 3, 881250000),
                         (2, 10, 2, 881250000), (2, 11, "x", 1)],
              [(10, "Toy Story", 1995, "Animation Children's Comedy"),
               (11, "GoldenEye", 1995, "Action Adventure Thriller"),
               (267, "unkonwn", "unkonwn", "unknown"), (12, "Unrated", "", "")])
    ds = load_dataset(str(tmp_path), "movielens")
    ds.check_invariants()
    assert [h.item_id for h in ds.users["1"]] == ["11", "10"]
    assert all(h.review == "" for h in ds.users["1"])
    toy = ds.items["10"]
    assert toy.title == "Toy Story (1995)" and toy.category == "Animation Children's Comedy"
    assert toy.description == "Released 1995. Genres: Animation Children's Comedy."
    assert ds.skipped == {"placeholder_item": 1, "unknown_item": 1, "bad_value:rating": 1,
                          "item_without_interactions": 1}
    ds = load_dataset(str(tmp_path / "ml-mini.inter"), "movielens",
                      review_template="Rated {rating:g}/5: {title}")
    assert ds.users["1"][0].review == "Rated 5/5: GoldenEye (1995)"
    with pytest.raises(RcllmError, match="review_template"):
        load_dataset(str(tmp_path), "movielens", review_template="{stars}")


def test_real_movielens(shared_data):
    ds = load_dataset(str(shared_data / "movielens-100k"), "movielens")
    ds.check_invariants()
    assert (len(ds.users), len(ds.items)) == (943, 1681)
    assert sum(len(h) for h in ds.users.values()) + ds.skipped["unknown_item"] == 100_000
    assert ds.skipped["placeholder_item"] == 1
