"""Class names as people and models write them, and as a person reads them.

"houses", "Pools", "bushes" and "cities" name the classes "house", "pool", "bush" and "city":
the tools (for a model's arguments) and the local agent (for a person's words) read a class
name by this one rule. The other way round, "solar_panel" reads "solar panel", "solar panels"
or "a solar panel" wherever a person sees a class (cards, summaries, the local agent's answers).
"""

import re
from collections.abc import Collection


def word_forms(word: str) -> list[str]:
    """A word as written and, if it may be a plural, its singulars: "cities" → "city",
    "bushes" → "bush" and "bushe", "trees" → "tree"."""
    forms: list[str] = []
    for form in (
        word,
        word[:-3] + "y" if word.endswith("ies") and len(word) > 4 else "",
        word[:-1] if word.endswith("s") and not word.endswith("ss") else "",
        word[:-2] if word.endswith("es") else "",
    ):
        if form and form not in forms:
            forms.append(form)
    return forms


def _forms(word: str) -> list[str]:
    forms: list[str] = []
    for spelled in (word, word.lower()):
        for form in word_forms(spelled):
            if form not in forms:
                forms.append(form)
    return forms


def class_match(word: str, classes: Collection[str]) -> str | None:
    """The class `word` names: itself, else its lower-case spelling, each as written or as the
    singular of a plural; None when it names none of `classes`."""
    for form in _forms(word.strip()):
        if form in classes:
            return form
    return None


def class_label(category: str) -> str:
    """A class as words: "solar_panel" → "solar panel", "Tree" → "tree"."""
    return " ".join(re.findall(r"[^\W_]+", category.lower())) or category


def class_plural(category: str) -> str:
    """ "trees", "bushes", "cities", "solar panels"."""
    *head, last = class_label(category).split(" ")
    if last.endswith("y") and last[-2:-1] not in tuple("aeiou"):
        last = last[:-1] + "ies"
    elif last.endswith(("s", "sh", "ch", "x", "z")):
        last += "es"
    else:
        last += "s"
    return " ".join([*head, last])


def class_noun(category: str, n: int) -> str:
    """The singular for one, the plural otherwise."""
    return class_label(category) if n == 1 else class_plural(category)


def with_article(category: str) -> str:
    """ "a house", "an orchard"."""
    word = class_label(category)
    return f"{'an' if word[:1] in tuple('aeiou') else 'a'} {word}"
