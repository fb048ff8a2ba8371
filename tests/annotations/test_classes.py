import pytest

from geosense.annotations.classes import class_match

CLASSES = {"house", "pool", "bush", "tree", "Shed"}


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("house", "house"),
        ("houses", "house"),
        ("Houses", "house"),
        ("POOL", "pool"),
        ("bushes", "bush"),
        (" trees ", "tree"),
        ("Shed", "Shed"),
        ("sheds", None),
        ("unicorns", None),
        ("", None),
    ],
)
def test_a_word_names_a_class_as_written_lower_cased_or_singular(word, expected):
    assert class_match(word, CLASSES) == expected


def test_a_class_that_ends_in_s_is_found_as_written_first():
    assert class_match("grass", {"grass", "gras"}) == "grass"
