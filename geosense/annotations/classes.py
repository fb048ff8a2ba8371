"""Class names as people and models write them.

"houses", "Pools" and "bushes" name the classes "house", "pool" and "bush": the tools (for a
model's arguments) and the local agent (for a person's words) read a class name by this one
rule.
"""

from collections.abc import Collection


def _forms(word: str) -> list[str]:
    forms: list[str] = []
    for spelled in (word, word.lower()):
        for form in (
            spelled,
            spelled[:-1] if spelled.endswith("s") else "",
            spelled[:-2] if spelled.endswith("es") else "",
        ):
            if form and form not in forms:
                forms.append(form)
    return forms


def class_match(word: str, classes: Collection[str]) -> str | None:
    """The class `word` names: itself, else its lower-case spelling, each as written or with a
    plural "s"/"es" dropped; None when it names none of `classes`."""
    for form in _forms(word.strip()):
        if form in classes:
            return form
    return None
