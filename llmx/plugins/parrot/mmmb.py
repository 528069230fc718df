"""MMMB (Parrot's Massive Multilingual Multimodal Benchmark) and multilingual MMBench in VLMEvalKit's multiple-choice
TSV: columns ``index``, base64 ``image`` (or the ``index`` of a row whose image it shares), ``question``, optional
``hint``, option columns ``A``, ``B``, ..., ``answer`` (a letter) and ``category``; one file per language named
``*_{en,cn,pt,ar,tr,ru}.tsv`` (Chinese is ``cn``: ``mmmb_cn.tsv``, ``mmbench_dev_cn.tsv``).

The prompt is Parrot's (VLMEvalKit ``vlm/parrot.py``): the hint and the question, one ``A. ...`` line per option,
then the instruction to answer with the option's letter in the question's language; the reply goes through Parrot's
post-processing and VLMEvalKit's letter extraction, scored by exact match. MMBench files hold rotated copies of each
question (``index + k * 1e6``) and are scored as VLMEvalKit does, by CircularEval: a question counts only when every
copy is right. ``write`` makes an MMMB-format set from held-out digit scenes: every question asked in each language
with the same options, shuffled by seed, and once per rotation of its options (copies ``index + k * 1e6``, scored by
CircularEval), so a letter is right equally often among the questions offering it and a constant letter is never
right."""

from __future__ import annotations

import base64
import csv
import io
import random
import string
import sys
from dataclasses import dataclass
from pathlib import Path

from llmx.core.multimodal import languages as L
from llmx.errors import UsageError

CIRCLE = 1_000_000  # VLMEvalKit: a rotated copy of question i has index i + k * 1e6
CODES = {"en": "en", "cn": "zh", "pt": "pt", "ar": "ar", "tr": "tr", "ru": "ru"}  # VLMEvalKit's file code -> ours
REQUIRED = ("index", "image", "question", "answer", "A", "B")
COLUMNS = ("index", "question", "hint", "A", "B", "C", "D", "answer", "category", "image")
STRIPPED = ("Answer with the option's letter from the given choices directly.", "请直接回答选项字母。")


@dataclass(frozen=True)
class Item:
    where: str  # file:line
    index: str
    language: str  # en, zh, pt, ar, tr, ru
    question: str
    hint: str | None
    options: tuple[str, ...]
    answer: int  # the right option's position
    category: str
    image: bytes  # encoded (PNG, JPEG...)

    def pil(self):
        from PIL import Image

        with Image.open(io.BytesIO(self.image)) as img:
            return img.convert("RGB")

    def asked(self) -> str:
        """The hint and the question."""
        return f"{self.hint}\n{self.question}" if self.hint else self.question

    def prompt(self) -> str:
        """Parrot's multiple-choice prompt: hint, question, the options, the instruction in this language."""
        return L.multiple_choice(self.language, self.asked(), list(self.options))


@dataclass(frozen=True)
class Picture:
    """An item's image where a scene is expected (``.image()``), decoded only when asked."""

    item: Item

    def image(self):
        return self.item.pil()


def postprocess(reply: str, prompt: str) -> str:
    """Parrot's answer cleaning (applied, as there, to prompts ending in the English or the older Chinese
    instruction): strip punctuation, keep a leading or trailing capital letter that stands apart, or cut after
    "answer is" / "answer:" and "option" and try again."""
    if not prompt.endswith(STRIPPED):
        return reply
    answer = reply
    while True:
        answer = answer.strip(string.punctuation + string.whitespace)
        if len(answer) <= 1:
            return answer
        apart = string.whitespace + string.punctuation
        if answer[0] in string.ascii_uppercase and answer[1] in apart:
            return answer[0]
        if answer[-1] in string.ascii_uppercase and answer[-2] in apart:
            return answer[-1]
        low = answer.lower()
        cut = next((p for p in ("answer is", "answer:") if p in low), None)
        if cut is None:
            return answer
        answer = answer[low.find(cut) + len(cut):]
        if "option" in answer.lower():
            answer = answer[answer.lower().find("option") + len("option"):]


def score(items: list[Item], replies: list[str]) -> tuple[list[int | None], list[float]]:
    """Each reply's picked option (Parrot's cleaning, then VLMEvalKit's extraction) and its exact-match score."""
    from llmx.core.multimodal.answer import choice

    picks = [choice(postprocess(r, it.prompt()), list(it.options)) for r, it in zip(replies, items, strict=True)]
    return picks, [float(k == it.answer) for k, it in zip(picks, items, strict=True)]


def files(path: str | Path) -> list[tuple[Path, str]]:
    """(file, language) for a TSV file or every ``*_{code}.tsv`` in a folder, all of one benchmark (one prefix)."""
    p = Path(path)
    found = sorted(p.glob("*.tsv")) if p.is_dir() else [p]
    out = []
    for f in found:
        code = f.stem.rsplit("_", 1)[-1].lower()
        if code not in CODES:
            raise UsageError(f"{f}: the name must end in _{{{','.join(CODES)}}}.tsv (the question's language)")
        out.append((f, CODES[code]))
    if not out:
        raise UsageError(f"{p}: no MMMB-format .tsv files (mmmb_en.tsv, mmmb_cn.tsv, ...)")
    if len(prefixes := {f.stem.rsplit("_", 1)[0].lower() for f, _ in out}) > 1:
        raise UsageError(f"{p}: files of several benchmarks ({', '.join(sorted(prefixes))}): give one at a time")
    if len({lang for _, lang in out}) < len(out):
        raise UsageError(f"{p}: two files of one language ({', '.join(f.name for f, _ in out)}): give one each")
    return out


def circular(path: str | Path, items: list[Item]) -> bool:
    """Whether VLMEvalKit scores these files by CircularEval: MMBench's, or any holding rotated copies."""
    return "mmbench" in files(path)[0][0].stem.lower() or any(_number(it) >= CIRCLE for it in items)


def _number(item: Item) -> int:
    try:
        return int(item.index)
    except ValueError:
        raise UsageError(f"{item.where}: index {item.index!r} is not an integer (CircularEval groups by index)") from None


def questions(items: list[Item], circular_eval: bool) -> list[list[int]]:
    """Each question's rows, its own first: every row alone, or under CircularEval (VLMEvalKit's
    ``mcq_circular_eval``) each question of index < 1e6 with its copies (index + k * 1e6); copies without their
    question are dropped."""
    if not circular_eval:
        return [[i] for i in range(len(items))]
    groups: dict[tuple[str, int], list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault((it.language, _number(it) % CIRCLE), []).append(i)
    rows = [sorted(g, key=lambda i: _number(items[i])) for g in groups.values()]
    return [g for g in rows if _number(items[g[0]]) < CIRCLE]


def grouped(items: list[Item], scores: list[float], circular_eval: bool) -> tuple[list[Item], list[float]]:
    """(question, score) per question (``questions``): its row's, or under CircularEval 1 only when all its rows are
    right."""
    groups = questions(items, circular_eval)
    return [items[g[0]] for g in groups], [min(scores[i] for i in g) for g in groups]


def read(path: str | Path, languages: list[str] | None = None) -> list[Item]:
    """Every question of the TSV file(s) at ``path`` in ``languages`` (default: all); a bad row is a usage error
    naming ``file:line``."""
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    items = []
    for f, lang in files(path):
        if languages is None or lang in languages:
            items += _read_file(f, lang)
    return items


def _read_file(f: Path, lang: str) -> list[Item]:
    with open(f, newline="", encoding="utf-8-sig") as handle:  # pandas reads a byte-order mark, so do we
        reader = csv.DictReader(handle, delimiter="\t")
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or ())]
        if missing:
            raise UsageError(f"{f}:1: missing column(s) {', '.join(missing)} (VLMEvalKit's multiple-choice TSV)")
        rows = [(reader.line_num, row) for row in reader]
    images = {row["index"]: row["image"] for _, row in rows if len(row["image"] or "") > 64}
    decoded: dict[str, bytes] = {}
    out = []
    for line, row in rows:
        where = f"{f}:{line}"
        given = [c for c in string.ascii_uppercase if (row.get(c) or "").strip()]
        letters = string.ascii_uppercase[:len(given)]
        if "".join(given) != letters:
            raise UsageError(f"{where}: options {', '.join(given)} leave a gap (give A, B, ... in order)")
        answer = (row.get("answer") or "").strip()
        if len(answer) != 1 or answer not in letters:
            raise UsageError(f"{where}: answer {answer!r} is not one of the options' letters {', '.join(letters)}")
        options = tuple(row[c] for c in letters)
        encoded = row["image"] or ""
        if len(encoded) <= 64:  # VLMEvalKit: a short value is the index of the row whose image this row shares
            if encoded not in images:
                raise UsageError(f"{where}: image {encoded!r} names no row's index with an image")
            encoded = images[encoded]
        if encoded not in decoded:
            decoded[encoded] = _image(encoded, where)
        out.append(Item(where, row["index"], lang, row["question"], (row.get("hint") or "").strip() or None, options,
                        letters.index(answer), row.get("category") or "", decoded[encoded]))
    return out


def _image(encoded: str, where: str) -> bytes:
    from PIL import Image

    try:
        data = base64.b64decode(encoded, validate=True)
        with Image.open(io.BytesIO(data)) as img:
            img.verify()
    except Exception as exc:  # binascii.Error, PIL's OSError, SyntaxError...
        raise UsageError(f"{where}: the image is not a base64-encoded picture ({type(exc).__name__})") from exc
    return data


def write(folder: str | Path, count: int, seed: int, languages: list[str]) -> list[Path]:
    """An MMMB-format set from ``count`` held-out digit scenes (test-split handwriting): one question per scene, its
    category (colour, size, cell, digit_at, count, relation) in turn, asked in each language with the same options in
    the same seeded order, then once per further rotation of its options (index + k * 1e6, the image shared by
    index), so over a question's rows the right answer is each of its letters once; one ``mmmb_{code}.tsv`` per
    language."""
    from llmx.core.multimodal import qa
    from llmx.core.multimodal.scenes import scenes

    rng = random.Random(f"mmmb:{seed}")
    rows = []
    for i, s in enumerate(scenes(count, "test", seed + 2000)):
        kinds = [k for k in qa.KINDS if k != "relation" or len(s.objects) > 1]
        kind = kinds[i % len(kinds)]
        slots, value = qa.ask(s, rng, kind)
        values = qa.option_values(kind, value, rng)
        buf = io.BytesIO()
        s.image().save(buf, format="PNG")
        image = base64.b64encode(buf.getvalue()).decode()
        for k in range(len(values)):
            turned = values[k:] + values[:k]
            rows.append((i + k * CIRCLE, kind, slots, turned, turned.index(value), image if k == 0 else str(i)))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    code = {ours: theirs for theirs, ours in CODES.items()}
    out = []
    for lang in languages:
        f = folder / f"mmmb_{code[lang]}.tsv"
        with open(f, "w", newline="", encoding="utf-8") as handle:
            w = csv.writer(handle, delimiter="\t")
            w.writerow(COLUMNS)
            for index, kind, slots, values, right, image in rows:
                options = [L.answer(lang, kind, v) for v in values] + [""] * (4 - len(values))
                w.writerow([index, L.question(lang, kind, **slots), "", *options, string.ascii_uppercase[right], kind,
                            image])
        out.append(f)
    return out
