import pytest

from geosense.annotations.classes import class_match, class_plural, with_article

CLASSES = {"house", "pool", "bush", "tree", "Shed", "city"}


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("house", "house"),
        ("houses", "house"),
        ("Houses", "house"),
        ("POOL", "pool"),
        ("bushes", "bush"),
        ("cities", "city"),
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


@pytest.mark.parametrize(
    ("category", "plural"),
    [
        ("tree", "trees"),
        ("bush", "bushes"),
        ("city", "cities"),
        ("solar_panel", "solar panels"),
        ("Bay", "bays"),
    ],
)
def test_a_class_reads_as_words_for_a_person(category, plural):
    assert class_plural(category) == plural


def test_a_class_takes_its_article():
    assert (with_article("house"), with_article("orchard")) == ("a house", "an orchard")
