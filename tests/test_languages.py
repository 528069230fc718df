"""The six-language phrase tables: their shape, their words, and the caption / answer round trips."""

from __future__ import annotations

import itertools
import random
import re
import string

import pytest

from llmx.core.multimodal import languages as L

FRAMES = ("object", "relation", "count", "count_one", "q_colour", "q_size", "q_cell", "q_digit_at", "q_count", "q_relation",
          "q_caption", "mc_instruction")
FRAME_SLOTS = {"object": {"size", "colour", "digit", "cell"}, "relation": {"a", "relation", "b"}, "count": {"count"},
               "count_one": {"count"}, "q_colour": {"digit"}, "q_size": {"digit"}, "q_cell": {"digit"}, "q_digit_at": {"cell"},
               "q_count": set(), "q_relation": {"a", "relation", "b"}, "q_caption": set(), "mc_instruction": set()}
VALUES = {"colour": list(L.COLOURS), "size": list(L.SIZES), "cell": list(L.CELLS), "digit_at": list(range(10)),
          "count": [1, 2, 3, 4], "relation": [True, False]}
SCENE = [(3, "red", "large", "top_left"), (5, "blue", "small", "top_right"), (8, "purple", "small", "bottom_right")]
SCENE_RELATIONS = [(3, "left_of", 5), (5, "above", 8)]


def slot_names(frame: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(frame) if name}


def words(table: dict) -> list[str]:
    """Every slot word but the counts (which may repeat digit words: "two digits", "the two")."""
    return [*table["digits"], *table["colours"].values(), *table["sizes"].values(), *table["cells"].values(),
            *table["relations"].values(), table["yes"], table["no"]]


def relations_of(objects):
    """Consecutive objects in reading order: ``left_of`` in the same row, else ``above``."""
    ordered = sorted(objects, key=lambda o: L.CELLS.index(o[3]))
    return [(a[0], "left_of" if L.CELLS.index(a[3]) // 2 == L.CELLS.index(b[3]) // 2 else "above", b[0])
            for a, b in itertools.pairwise(ordered)]


def scenes(seed: int = 0, draws: int = 12):
    """Every 1-4 cell combination, ``draws`` times each, with distinct random digits, colours, sizes, shuffled order."""
    rng = random.Random(seed)
    for n in range(1, 5):
        for cells in itertools.combinations(L.CELLS, n):
            for _ in range(draws):
                digits = rng.sample(range(10), n)
                objs = [(d, rng.choice(L.COLOURS), rng.choice(L.SIZES), c) for d, c in zip(digits, cells, strict=True)]
                rng.shuffle(objs)
                yield objs, relations_of(objs)


def test_tables_have_the_same_keys_and_every_key():
    keys = set(L.TABLES["en"])
    assert set(L.TABLES) == set(L.LANGUAGES)
    assert keys == {"digits", "colours", "sizes", "cells", "relations", "counts", "yes", "no", "joiner", *FRAMES}
    for lang, t in L.TABLES.items():
        assert set(t) == keys, lang
        assert len(t["digits"]) == 10 and len(t["counts"]) == 4, lang
        assert set(t["colours"]) == set(L.COLOURS) and set(t["sizes"]) == set(L.SIZES), lang
        assert set(t["cells"]) == set(L.CELLS) and set(t["relations"]) == set(L.RELATIONS), lang
        for frame in FRAMES:
            assert slot_names(t[frame]) == FRAME_SLOTS[frame], (lang, frame)


@pytest.mark.parametrize("lang", L.LANGUAGES)
def test_slot_words_are_distinct(lang):
    t = L.TABLES[lang]
    folded = [w.casefold() for w in words(t)]
    assert len(set(folded)) == len(folded)
    counts = [w.casefold() for w in t["counts"]]
    assert len(set(counts)) == 4
    assert not set(counts) & set(folded[10:])  # counts may only coincide with digit words
    assert all(w == " ".join(w.split()) and w for w in words(t) + list(t["counts"]))  # no stray whitespace


@pytest.mark.parametrize("lang", L.LANGUAGES)
def test_sentence_punctuation(lang):
    t = L.TABLES[lang]
    stop, ask = {"zh": ("。", "？"), "ar": (".", "؟")}.get(lang, (".", "?"))
    for frame in FRAMES:
        if frame.startswith("q_") and frame != "q_caption":
            assert t[frame].endswith(ask), frame
        elif frame.endswith("label"):
            assert t[frame].endswith("：" if lang == "zh" else ":"), frame
        else:
            assert t[frame].endswith(stop), frame
    if lang == "zh":
        assert not any(re.search(r"[.?:,]", t[f]) for f in FRAMES)


@pytest.mark.parametrize("lang", L.LANGUAGES)
def test_caption_round_trip(lang):
    n = 0
    for objs, rels in scenes():
        text = L.caption(lang, objs, rels)
        assert L.parse_caption(lang, text) == L.truth(objs, rels), text
        n += 1
    assert n == 15 * 12


def test_truth_format_and_caption_order():
    t = L.truth(SCENE, SCENE_RELATIONS)
    assert t[:4] == [("object", "3"), ("attribute", "3", "colour", "red"), ("attribute", "3", "size", "large"),
                     ("attribute", "3", "cell", "top_left")]
    assert t[-2:] == [("relation", "3", "left_of", "5"), ("relation", "5", "above", "8")]
    assert len(t) == 3 * 4 + 2
    en = L.caption("en", SCENE, SCENE_RELATIONS)
    assert en.startswith("There are three digits. A large red three is at the top left.")
    assert L.caption("en", SCENE[:1], []) == "There is one digit. A large red three is at the top left."
    assert "。" in L.caption("zh", SCENE, SCENE_RELATIONS) and " " not in L.caption("zh", SCENE, SCENE_RELATIONS)


@pytest.mark.parametrize("lang", L.LANGUAGES)
def test_parser_tolerates_whitespace_and_repeats(lang):
    text = L.caption(lang, SCENE, SCENE_RELATIONS)
    spaced = "  \n" + text.replace(" ", "   \t") + "  "
    if lang == "zh":
        spaced = " ".join(text)  # a space between every character
    assert L.parse_caption(lang, spaced) == L.truth(SCENE, SCENE_RELATIONS)
    assert L.parse_caption(lang, text + L.TABLES[lang]["joiner"] + text) == L.truth(SCENE, SCENE_RELATIONS)


@pytest.mark.parametrize("lang", L.LANGUAGES)
def test_corrupted_word_changes_its_tuple(lang):
    t = L.TABLES[lang]
    text = L.caption(lang, SCENE, SCENE_RELATIONS)
    red, green = t["colours"]["red"], t["colours"]["green"]
    assert text.count(red) == 1
    expected = [("attribute", "3", "colour", "green") if x == ("attribute", "3", "colour", "red") else x
                for x in L.truth(SCENE, SCENE_RELATIONS)]
    assert L.parse_caption(lang, text.replace(red, green)) == expected
    large = t["sizes"]["large"]
    assert text.count(large) == 1
    broken = L.parse_caption(lang, text.replace(large, "xyzzy"))  # the first object's sentence no longer parses
    assert broken == L.truth(SCENE[1:], SCENE_RELATIONS)


def test_garbage_never_raises():
    rng = random.Random(1)
    garbage = ["", " ", ".", "。。？", "\n\n", "{digit}", "A A A", "ﷺ" * 50, " " * 10000 + "x",
               "".join(chr(rng.randrange(1, 0x2FFFF)) for _ in range(2000))]
    garbage += ["".join(rng.choice(" .?。abc三红色цифраالرقم") for _ in range(300)) for _ in range(50)]
    for lang in L.LANGUAGES:
        for text in garbage:
            assert isinstance(L.parse_caption(lang, text), list)
            for kind in L.ANSWER_KINDS:
                L.parse_answer(lang, kind, text)
        for other in L.LANGUAGES:
            if other != lang:
                assert L.parse_caption(lang, L.caption(other, SCENE, SCENE_RELATIONS)) == [], (lang, other)


@pytest.mark.parametrize("lang", L.LANGUAGES)
def test_answer_round_trip(lang):
    for kind, values in VALUES.items():
        rendered = [L.answer(lang, kind, v) for v in values]
        assert len(set(rendered)) == len(values), kind
        for v, text in zip(values, rendered, strict=True):
            assert L.parse_answer(lang, kind, text) == v, (kind, v)
            assert type(L.parse_answer(lang, kind, text)) is type(v)
            if lang != "zh":
                assert L.parse_answer(lang, kind, f"ASSISTANT: {text.upper()}.") == v, (kind, v)
        assert L.parse_answer(lang, kind, "") is None
    if lang == "en":
        assert L.parse_answer("en", "colour", "It is blue, not red.") == "blue"  # the first word
        assert L.parse_answer("en", "relation", "nothing known") is None  # whole words only
        assert L.parse_answer("en", "cell", "the bottom right one") == "bottom_right"


@pytest.mark.parametrize("lang", L.LANGUAGES)
def test_questions_render_table_words(lang):
    t = L.TABLES[lang]
    assert L.question(lang, "colour", digit=7) == t["q_colour"].format(digit=t["digits"][7])
    assert L.question(lang, "digit_at", cell="bottom_left") == t["q_digit_at"].format(cell=t["cells"]["bottom_left"])
    q = L.question(lang, "relation", a=2, relation="above", b=9)
    assert t["digits"][2] in q and t["relations"]["above"] in q and t["digits"][9] in q
    assert L.question(lang, "count") == t["q_count"] and L.question(lang, "caption") == t["q_caption"]


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="en, zh, ru, pt, ar, tr"):
        L.caption("fr", SCENE, [])
    with pytest.raises(ValueError, match="purple"):
        L.object_sentence("en", 3, "pink", "large", "top_left")
    with pytest.raises(ValueError, match="left_of"):
        L.relation_sentence("en", 3, "below", 5)
    with pytest.raises(ValueError, match="caption"):
        L.question("en", "weather")
    with pytest.raises(ValueError):
        L.question("en", "colour")  # a missing slot
    with pytest.raises(ValueError):
        L.answer("en", "digit_at", True)  # a bool is no digit
    with pytest.raises(ValueError):
        L.answer("en", "count", 5)
    with pytest.raises(ValueError, match="relation"):
        L.parse_answer("en", "caption", "yes")


@pytest.mark.parametrize("lang", L.LANGUAGES)
def test_multiple_choice_layout(lang):
    options = [L.answer(lang, "colour", c) for c in L.COLOURS[:4]]
    q = L.question(lang, "colour", digit=3)
    lines = L.multiple_choice(lang, q, options).split("\n")
    assert lines == [q, *(f"{letter}. {o}" for letter, o in zip("ABCD", options, strict=True)), L.TABLES[lang]["mc_instruction"]]
    with pytest.raises(ValueError):
        L.multiple_choice(lang, q, [])


def test_other_languages_are_not_english():
    en = L.TABLES["en"]
    for lang in ("zh", "ru", "ar"):
        t = L.TABLES[lang]
        for text in [t[f] for f in FRAMES] + words(t) + list(t["counts"]):
            assert not re.search("[A-Za-z]", re.sub(r"\{\w+\}", "", text)), (lang, text)
    for lang in ("pt", "tr"):
        t = L.TABLES[lang]
        for f in FRAMES:
            assert t[f] != en[f], (lang, f)
        assert not set(t["colours"].values()) & set(en["colours"].values())
        assert not set(t["digits"][1:]) & set(en["digits"])
