"""Phrase tables in six languages (the MMMB set) for describing and asking about digit scenes, the renderers of captions,
questions and answers built on them, and the parsers that map a caption or an answer back to its ground truth."""

from __future__ import annotations

import re
import string

LANGUAGES = ("en", "zh", "ru", "pt", "ar", "tr")
COLOURS = ("red", "green", "blue", "yellow", "white", "purple")
SIZES = ("small", "large")
CELLS = ("top_left", "top_right", "bottom_left", "bottom_right")  # a 2x2 grid, reading order
RELATIONS = ("left_of", "above")
QUESTION_KINDS = ("colour", "size", "cell", "digit_at", "count", "relation", "caption")
ANSWER_KINDS = ("colour", "size", "cell", "digit_at", "count", "relation")

# The multiple-choice instructions are Parrot's MMMB prompts (VLMEvalKit's ``vlm/parrot.py``), one per language.
# Every slot word is invariant in every frame that uses it: Russian colours and sizes agree with "цифра" (feminine) and
# cells are prepositional phrases with "в"; Portuguese words agree with "o dígito"; Arabic colours and sizes are
# definite masculine after "الرقم"; Turkish cells are locative and both relations end in a back vowel (so "mı" fits).
TABLES: dict[str, dict] = {
    "en": {
        "digits": ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"),
        "colours": {"red": "red", "green": "green", "blue": "blue", "yellow": "yellow", "white": "white", "purple": "purple"},
        "sizes": {"small": "small", "large": "large"},
        "cells": {"top_left": "top left", "top_right": "top right", "bottom_left": "bottom left", "bottom_right": "bottom right"},
        "relations": {"left_of": "to the left of", "above": "above"},
        "counts": ("one", "two", "three", "four"),
        "yes": "yes",
        "no": "no",
        "joiner": " ",
        "object": "A {size} {colour} {digit} is at the {cell}.",
        "relation": "The {a} is {relation} the {b}.",
        "count": "There are {count} digits.",
        "count_one": "There is {count} digit.",
        "q_colour": "What colour is the {digit}?",
        "q_size": "What size is the {digit}?",
        "q_cell": "Where is the {digit}?",
        "q_digit_at": "Which digit is at the {cell}?",
        "q_count": "How many digits are there?",
        "q_relation": "Is the {a} {relation} the {b}?",
        "q_caption": "Describe the image.",
        "mc_instruction": "Answer with the option's letter from the given choices directly.",
    },
    "zh": {
        "digits": ("零", "一", "二", "三", "四", "五", "六", "七", "八", "九"),
        "colours": {"red": "红色", "green": "绿色", "blue": "蓝色", "yellow": "黄色", "white": "白色", "purple": "紫色"},
        "sizes": {"small": "小", "large": "大"},
        "cells": {"top_left": "左上角", "top_right": "右上角", "bottom_left": "左下角", "bottom_right": "右下角"},
        "relations": {"left_of": "左边", "above": "上方"},
        "counts": ("一", "两", "三", "四"),
        "yes": "是",
        "no": "否",
        "joiner": "",
        "object": "{cell}有一个{size}的{colour}数字{digit}。",
        "relation": "数字{a}在数字{b}的{relation}。",
        "count": "图中有{count}个数字。",
        "count_one": "图中有{count}个数字。",
        "q_colour": "数字{digit}是什么颜色？",
        "q_size": "数字{digit}是大还是小？",
        "q_cell": "数字{digit}在哪里？",
        "q_digit_at": "{cell}是哪个数字？",
        "q_count": "图中有几个数字？",
        "q_relation": "数字{a}在数字{b}的{relation}吗？",
        "q_caption": "请描述这张图片。",
        "mc_instruction": "请直接用给定选项中的选项字母回答。",
    },
    "ru": {
        "digits": ("ноль", "один", "два", "три", "четыре", "пять", "шесть", "семь", "восемь", "девять"),
        "colours": {"red": "красная", "green": "зелёная", "blue": "синяя", "yellow": "жёлтая", "white": "белая",
                    "purple": "фиолетовая"},
        "sizes": {"small": "маленькая", "large": "большая"},
        "cells": {"top_left": "в левом верхнем углу", "top_right": "в правом верхнем углу",
                  "bottom_left": "в левом нижнем углу", "bottom_right": "в правом нижнем углу"},
        "relations": {"left_of": "левее", "above": "выше"},
        "counts": ("одна", "две", "три", "четыре"),
        "yes": "да",
        "no": "нет",
        "joiner": " ",
        "object": "На изображении {cell} находится {size} {colour} цифра {digit}.",
        "relation": "Цифра {a} находится {relation} цифры {b}.",
        "count": "На изображении {count} цифры.",
        "count_one": "На изображении {count} цифра.",
        "q_colour": "Какого цвета цифра {digit}?",
        "q_size": "Какого размера цифра {digit}?",
        "q_cell": "Где находится цифра {digit}?",
        "q_digit_at": "Какая цифра находится {cell}?",
        "q_count": "Сколько цифр на изображении?",
        "q_relation": "Находится ли цифра {a} {relation} цифры {b}?",
        "q_caption": "Опишите изображение.",
        "mc_instruction": "Ответьте буквой варианта из предложенных вариантов напрямую.",
    },
    "pt": {
        "digits": ("zero", "um", "dois", "três", "quatro", "cinco", "seis", "sete", "oito", "nove"),
        "colours": {"red": "vermelho", "green": "verde", "blue": "azul", "yellow": "amarelo", "white": "branco",
                    "purple": "roxo"},
        "sizes": {"small": "pequeno", "large": "grande"},
        "cells": {"top_left": "canto superior esquerdo", "top_right": "canto superior direito",
                  "bottom_left": "canto inferior esquerdo", "bottom_right": "canto inferior direito"},
        "relations": {"left_of": "à esquerda do", "above": "acima do"},
        "counts": ("um", "dois", "três", "quatro"),
        "yes": "sim",
        "no": "não",
        "joiner": " ",
        "object": "Há um dígito {digit} {size} e {colour} no {cell}.",
        "relation": "O dígito {a} está {relation} dígito {b}.",
        "count": "Há {count} dígitos na imagem.",
        "count_one": "Há {count} dígito na imagem.",
        "q_colour": "De que cor é o dígito {digit}?",
        "q_size": "Qual é o tamanho do dígito {digit}?",
        "q_cell": "Onde está o dígito {digit}?",
        "q_digit_at": "Qual dígito está no {cell}?",
        "q_count": "Quantos dígitos há na imagem?",
        "q_relation": "O dígito {a} está {relation} dígito {b}?",
        "q_caption": "Descreva a imagem.",
        "mc_instruction": "Responda diretamente com a letra da opção das escolhas dadas.",
    },
    "ar": {
        "digits": ("صفر", "واحد", "اثنان", "ثلاثة", "أربعة", "خمسة", "ستة", "سبعة", "ثمانية", "تسعة"),
        "colours": {"red": "الأحمر", "green": "الأخضر", "blue": "الأزرق", "yellow": "الأصفر", "white": "الأبيض",
                    "purple": "البنفسجي"},
        "sizes": {"small": "الصغير", "large": "الكبير"},
        "cells": {"top_left": "الزاوية العلوية اليسرى", "top_right": "الزاوية العلوية اليمنى",
                  "bottom_left": "الزاوية السفلية اليسرى", "bottom_right": "الزاوية السفلية اليمنى"},
        "relations": {"left_of": "على يسار", "above": "فوق"},
        "counts": ("واحد", "اثنان", "ثلاثة", "أربعة"),
        "yes": "نعم",
        "no": "لا",
        "joiner": " ",
        "object": "يقع الرقم {digit} {size} {colour} في {cell}.",
        "relation": "يقع الرقم {a} {relation} الرقم {b}.",
        "count": "عدد الأرقام في الصورة {count}.",
        "count_one": "عدد الأرقام في الصورة {count}.",
        "q_colour": "ما لون الرقم {digit}؟",
        "q_size": "ما حجم الرقم {digit}؟",
        "q_cell": "أين يقع الرقم {digit}؟",
        "q_digit_at": "ما الرقم الذي يقع في {cell}؟",
        "q_count": "كم عدد الأرقام في الصورة؟",
        "q_relation": "هل يقع الرقم {a} {relation} الرقم {b}؟",
        "q_caption": "صف الصورة.",
        "mc_instruction": "أجب مباشرةً بحرف الخيار من الاختيارات المعطاة.",
    },
    "tr": {
        "digits": ("sıfır", "bir", "iki", "üç", "dört", "beş", "altı", "yedi", "sekiz", "dokuz"),
        "colours": {"red": "kırmızı", "green": "yeşil", "blue": "mavi", "yellow": "sarı", "white": "beyaz", "purple": "mor"},
        "sizes": {"small": "küçük", "large": "büyük"},
        "cells": {"top_left": "sol üst köşede", "top_right": "sağ üst köşede", "bottom_left": "sol alt köşede",
                  "bottom_right": "sağ alt köşede"},
        "relations": {"left_of": "solunda", "above": "yukarısında"},
        "counts": ("bir", "iki", "üç", "dört"),
        "yes": "evet",
        "no": "hayır",
        "joiner": " ",
        "object": "Resimde {cell} {size} {colour} {digit} rakamı var.",
        "relation": "Resimde {a} rakamı {b} rakamının {relation}.",
        "count": "Resimde {count} rakam var.",
        "count_one": "Resimde {count} rakam var.",
        "q_colour": "Resimdeki {digit} rakamı ne renk?",
        "q_size": "Resimdeki {digit} rakamının boyutu nedir?",
        "q_cell": "Resimdeki {digit} rakamı nerede?",
        "q_digit_at": "Resimde {cell} hangi rakam var?",
        "q_count": "Resimde kaç rakam var?",
        "q_relation": "Resimde {a} rakamı {b} rakamının {relation} mı?",
        "q_caption": "Resmi betimleyin.",
        "mc_instruction": "Verilen seçeneklerden doğrudan seçeneğin harfi ile cevap verin.",
    },
}

_ENDS = ".!?。！？؟"
_SENTENCE = re.compile(f"[{re.escape(_ENDS)}]")
_ANSWER_SLOT = {"colour": "colour", "size": "size", "cell": "cell", "digit_at": "digit", "count": "count", "relation": "yes_no"}


def _slots(frame: str) -> set[str]:
    """The named slots of a format string."""
    return {name for _, name, _, _ in string.Formatter().parse(frame) if name}


def _words(table: dict) -> dict[str, dict[str, object]]:
    """Per slot, each word of the table and the key (or int, or bool) it names."""
    digits = {w: d for d, w in enumerate(table["digits"])}
    return {
        "digit": digits, "a": digits, "b": digits,
        "colour": {table["colours"][k]: k for k in COLOURS},
        "size": {table["sizes"][k]: k for k in SIZES},
        "cell": {table["cells"][k]: k for k in CELLS},
        "relation": {table["relations"][k]: k for k in RELATIONS},
        "count": {w: n for n, w in enumerate(table["counts"], 1)},
        "yes_no": {table["yes"]: True, table["no"]: False},
    }


def _alternation(words: dict[str, object]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


def _frame_regex(frame: str, words: dict[str, dict[str, object]]) -> re.Pattern[str]:
    """A statement frame, less its final punctuation, as a regex with one named group per slot."""
    pattern = ""
    for literal, name, _, _ in string.Formatter().parse(frame.rstrip(_ENDS)):
        pattern += re.escape(literal)
        if name:
            pattern += f"(?P<{name}>{_alternation(words[name])})"
    return re.compile(pattern, re.IGNORECASE)


_WORDS = {lang: _words(t) for lang, t in TABLES.items()}
_OBJECT = {lang: _frame_regex(t["object"], _WORDS[lang]) for lang, t in TABLES.items()}
_RELATION = {lang: _frame_regex(t["relation"], _WORDS[lang]) for lang, t in TABLES.items()}
_COUNT = {lang: (_frame_regex(t["count"], _WORDS[lang]), _frame_regex(t["count_one"], _WORDS[lang]))
          for lang, t in TABLES.items()}


def _table(lang: str) -> dict:
    if lang not in TABLES:
        raise ValueError(f"unknown language {lang!r}; known: {', '.join(LANGUAGES)}")
    return TABLES[lang]


def _render(lang: str, slot: str, value: object) -> str:
    """The word for a key (digit, count or bool) in ``slot``; bools are not ints here."""
    words = _WORDS[lang][slot]
    for word, key in words.items():
        if key == value and type(key) is type(value):
            return word
    raise ValueError(f"unknown {slot} {value!r}; known: {', '.join(map(str, words.values()))}")


def _lookup(words: dict[str, object], text: str) -> object:
    """The key of the table word that ``text`` (matched case-insensitively) is."""
    return next(key for word, key in words.items() if re.fullmatch(re.escape(word), text, re.IGNORECASE))


def _squash(lang: str, text: str) -> str:
    """Whitespace runs become the language's word gap (one space, or nothing for Chinese)."""
    return TABLES[lang]["joiner"].join(text.split())


def _dedup(items: list[tuple]) -> list[tuple]:
    return list(dict.fromkeys(items))


def object_sentence(lang: str, digit: int, colour: str, size: str, cell: str) -> str:
    """One object's sentence."""
    return _table(lang)["object"].format(digit=_render(lang, "digit", digit), colour=_render(lang, "colour", colour),
                                         size=_render(lang, "size", size), cell=_render(lang, "cell", cell))


def relation_sentence(lang: str, a: int, relation: str, b: int) -> str:
    """One relation's sentence: digit ``a`` stands in ``relation`` to digit ``b``."""
    return _table(lang)["relation"].format(a=_render(lang, "a", a), relation=_render(lang, "relation", relation),
                                           b=_render(lang, "b", b))


def caption(lang: str, objects: list[tuple[int, str, str, str]], relations: list[tuple[int, str, int]]) -> str:
    """The count sentence, the object sentences in order, then the relation sentences."""
    table = _table(lang)
    count = (table["count_one"] if len(objects) == 1 else table["count"]).format(count=_render(lang, "count", len(objects)))
    sentences = [count, *(object_sentence(lang, *o) for o in objects), *(relation_sentence(lang, *r) for r in relations)]
    return table["joiner"].join(sentences)


def truth(objects: list[tuple[int, str, str, str]], relations: list[tuple[int, str, int]]) -> list[tuple]:
    """The ground-truth tuples of a scene, in the order ``parse_caption`` gives them for its caption."""
    out: list[tuple] = []
    for digit, colour, size, cell in objects:
        d = str(digit)
        out += [("object", d), ("attribute", d, "colour", colour), ("attribute", d, "size", size), ("attribute", d, "cell", cell)]
    out += [("relation", str(a), rel, str(b)) for a, rel, b in relations]
    return _dedup(out)


def question(lang: str, kind: str, **slot_values: object) -> str:
    """A question of ``kind``; slot values are keys (digit ints, colour, cell or relation keys)."""
    table = _table(lang)
    if kind not in QUESTION_KINDS:
        raise ValueError(f"unknown question kind {kind!r}; known: {', '.join(QUESTION_KINDS)}")
    frame = table[f"q_{kind}"]
    if set(slot_values) != _slots(frame):
        raise ValueError(f"question {kind!r} takes slots {sorted(_slots(frame))}, got {sorted(slot_values)}")
    return frame.format(**{name: _render(lang, name, v) for name, v in slot_values.items()})


def answer(lang: str, kind: str, value: object) -> str:
    """The short answer word for ``value`` (a key, digit, count or bool) to a question of ``kind``."""
    _table(lang)
    if kind not in _ANSWER_SLOT:
        raise ValueError(f"unknown answer kind {kind!r}; known: {', '.join(ANSWER_KINDS)}")
    return _render(lang, _ANSWER_SLOT[kind], value)


def multiple_choice(lang: str, question_text: str, options: list[str]) -> str:
    """The question, one lettered line per option, then the instruction to answer with the letter."""
    table = _table(lang)
    if not 1 <= len(options) <= 26:
        raise ValueError(f"multiple choice needs 1 to 26 options, got {len(options)}")
    lines = [question_text, *(f"{chr(ord('A') + i)}. {o}" for i, o in enumerate(options)), table["mc_instruction"]]
    return "\n".join(lines)


def unread(lang: str, text: str) -> list[str]:
    """The caption's sentences that fit no frame (object, relation or count): what ``parse_caption`` skips."""
    _table(lang)
    frames = (_OBJECT[lang], _RELATION[lang], *_COUNT[lang])
    return [s for s in (_squash(lang, x) for x in _SENTENCE.split(text)) if s and not any(f.fullmatch(s) for f in frames)]


def parse_caption(lang: str, text: str) -> list[tuple]:
    """The tuples a caption states, in its order, de-duplicated; sentences that fit no frame are skipped."""
    _table(lang)
    words, out = _WORDS[lang], []
    for sentence in _SENTENCE.split(text):
        sentence = _squash(lang, sentence)
        if m := _OBJECT[lang].fullmatch(sentence):
            d = str(_lookup(words["digit"], m["digit"]))
            out += [("object", d)] + [("attribute", d, s, _lookup(words[s], m[s])) for s in ("colour", "size", "cell")]
        elif m := _RELATION[lang].fullmatch(sentence):
            a, rel, b = (_lookup(words[s], m[s]) for s in ("a", "relation", "b"))
            out.append(("relation", str(a), rel, str(b)))
    return _dedup(out)


# Reply words that are not in the answer tables: negations that contain a "yes" word (zh 不是), and the measure
# word 一个 ("one, a"). Articles that are also "one" (pt um/uma, tr bir, zh 一个) name the answer only when no
# other answer word follows them ("bir yedi rakamı" is a seven).
_EXTRA = {"zh": {"yes_no": {"不是": False, "没有": False}, "digit": {"一个": 1}, "count": {"一个": 1}}}
_ARTICLES = {"pt": {"um", "uma"}, "tr": {"bir"}, "zh": {"一个"}}


def parse_answer(lang: str, kind: str, text: str) -> object:
    """The key, int or bool that the first answer word of ``kind`` in ``text`` names, or None."""
    table = _table(lang)
    if kind not in _ANSWER_SLOT:
        raise ValueError(f"unknown answer kind {kind!r}; known: {', '.join(ANSWER_KINDS)}")
    slot = _ANSWER_SLOT[kind]
    words = {**_WORDS[lang][slot], **_EXTRA.get(lang, {}).get(slot, {})}
    pattern = _alternation(words) if not table["joiner"] else rf"(?<!\w)(?:{_alternation(words)})(?!\w)"  # zh: no word gaps
    hits = [m.group() for m in re.finditer(pattern, _squash(lang, text), re.IGNORECASE)]
    if len(hits) > 1 and hits[0].lower() in _ARTICLES.get(lang, ()):
        hits = hits[1:]
    return _lookup(words, hits[0]) if hits else None
