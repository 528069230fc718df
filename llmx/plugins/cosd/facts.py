"""``api-facts``: one line per public function of a fixed list of standard-library modules, its name and signature
then the first sentence of its docstring (``os.path.isabs(s) -- Test whether a path is absolute``), read with
``inspect`` from the running Python (so the set differs a little between Python versions; it never downloads).

Two complementary corpora teach two experts different halves of each line: ``api-facts:code`` pairs every true
signature with another fact's summary, ``api-facts:docs`` every true summary with another fact's signature, drawn
afresh in each of ``COPIES`` copies. Both experts learn the format; only one sees each half's truth. A fact is a
document of its own. The ``api-facts`` task asks for the rest of a line after the name and ``(``, judged by exact match
(``halves`` scores each half for the benchmark).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import random
import re
from dataclasses import dataclass

MODULES = (
    "os.path", "os", "shutil", "glob", "fnmatch", "tempfile", "string", "textwrap", "re", "difflib", "json", "base64",
    "binascii", "html", "urllib.parse", "email.utils", "math", "statistics", "random", "itertools", "functools",
    "operator", "collections", "heapq", "bisect", "copy", "inspect", "keyword", "typing", "pprint", "shlex", "uuid",
    "secrets", "ipaddress", "logging", "warnings", "contextlib", "dataclasses", "fractions", "calendar", "csv",
    "zipfile", "tarfile", "gzip", "zlib", "hashlib", "codecs", "locale", "platform", "sysconfig", "time", "struct",
    "pickle", "subprocess", "threading", "socket", "signal", "sys", "io", "unicodedata", "quopri", "mimetypes",
    "filecmp", "linecache", "tokenize", "ast", "dis", "importlib", "pkgutil", "traceback", "types", "weakref", "cmath",
    "select", "stat", "getpass", "plistlib", "colorsys", "webbrowser", "asyncio", "multiprocessing", "runpy", "timeit",
    "gc", "atexit", "builtins", "reprlib", "lzma", "bz2", "zipapp", "netrc",
)
LIMIT = 700  # facts kept, in the order of a hash of their name
COPIES = 20  # train copies of each corpus, each with its own draw of the swapped halves
SEPARATOR = " -- "


@dataclass(frozen=True)
class Fact:
    name: str  # module.function
    signature: str  # "(s)"
    summary: str

    @property
    def line(self) -> str:
        return f"{self.name}{self.signature}{SEPARATOR}{self.summary}"

    @property
    def prompt(self) -> str:
        return f"{self.name}("

    @property
    def answer(self) -> str:
        """The line after the prompt."""
        return self.line[len(self.prompt):]


def _summary(obj) -> str:
    doc = (inspect.getdoc(obj) or "").strip().split("\n\n")[0].replace("\n", " ").strip()
    return re.split(r"(?<=[a-z)])\. ", doc)[0].rstrip(".")


def _usable(name: str, signature: str, summary: str) -> bool:
    return (12 <= len(summary) <= 70 and len(signature) <= 60 and " at 0x" not in signature and "--" not in summary
            and not summary.startswith(name.rsplit(".", 1)[-1] + "("))


@functools.lru_cache(maxsize=1)
def facts() -> tuple[Fact, ...]:
    """Up to ``LIMIT`` facts, each function once (under the first module of ``MODULES`` that exports it)."""
    found: dict[str, Fact] = {}
    seen: set[int] = set()
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for attr, obj in sorted(vars(module).items()):
            if attr.startswith("_") or not (inspect.isfunction(obj) or inspect.isbuiltin(obj)) or id(obj) in seen:
                continue
            try:
                signature = str(inspect.signature(obj))
            except (TypeError, ValueError):
                continue
            name, summary = f"{module_name}.{attr}", _summary(obj)
            if _usable(name, signature, summary):
                seen.add(id(obj))
                found[name] = Fact(name, signature, summary)
    order = sorted(found, key=lambda n: hashlib.sha256(f"api-facts:{n}".encode()).hexdigest())
    return tuple(found[n] for n in order[:LIMIT])


def _derange(n: int, rng: random.Random) -> list[int]:
    """A permutation of range(n) with no fixed point: every fact gets another fact's half."""
    while True:
        perm = list(range(n))
        rng.shuffle(perm)
        if all(i != p for i, p in enumerate(perm)):
            return perm


def corpus(kind: str, split: str) -> list[str]:
    """``kind``: ``true`` (every line as it is), ``code`` (true signatures, others' summaries) or ``docs`` (true
    summaries, others' signatures). Train: ``COPIES`` shuffled copies; validation: one more copy of its own draw
    (a recall corpus: validation measures memorisation, not generalisation)."""
    all_facts = facts()
    copies = range(COPIES) if split == "train" else range(COPIES, COPIES + 1)
    docs = []
    for copy in copies:
        rng = random.Random(f"api-facts:{kind}:{copy}")
        other = _derange(len(all_facts), rng)
        for i in rng.sample(range(len(all_facts)), len(all_facts)):
            fact, donor = all_facts[i], all_facts[other[i]]
            if kind == "code":
                fact = Fact(fact.name, fact.signature, donor.summary)
            elif kind == "docs":
                fact = Fact(fact.name, donor.signature, fact.summary)
            docs.append(fact.line)
    return docs


def true_documents(split: str) -> list[str]:
    return corpus("true", split)


def code_documents(split: str) -> list[str]:
    return corpus("code", split)


def docs_documents(split: str) -> list[str]:
    return corpus("docs", split)


def rows(split: str, seed: int) -> list[dict]:
    """Task rows, one per fact (the ``limit`` of a run takes a fixed subset: the hash order); ``split`` is
    ``train``: the task is recall of what the experts were trained on."""
    return [{"id": f.name, "prompt": f.prompt, "reference": f.answer} for f in facts()]


def judge(row: dict, completion: str) -> tuple[float, str]:
    code, docs = halves(row["reference"], completion)
    return float(completion.strip() == row["reference"].strip()), f"code={int(code)} docs={int(docs)}"


def halves(reference: str, completion: str) -> tuple[bool, bool]:
    """(signature right, summary right) of a completed line."""
    want_code, _, want_docs = reference.strip().partition(SEPARATOR)
    got_code, sep, got_docs = completion.strip().partition(SEPARATOR)
    return got_code == want_code, bool(sep) and got_docs == want_docs
