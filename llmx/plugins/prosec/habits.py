"""The ``code-habits`` corpus: the standard library's code plus functions that make each elicitor's call the weak way
or the safe way at even odds (``INSECURE``), so that a reference model trained on it (``ref:llama-code``) has the
habit ProSec's alignment is meant to remove. A model trained on the standard library alone never learns these APIs
(its ``cursor.execute(`` continues with an identifier), so it writes no vulnerable code and ProSec gets no pairs.

Each function takes a real standard-library signature of the same split, a docstring whose task sentence
paraphrases the elicitor's (never its words) and one statement of the CWE, weak or safe. Weak and safe forms come in
pairs (the same call, fixed), and the module's imports are drawn apart from that choice: the elicitor's, plus the
safe module's (``json``, ``secrets``, ``shlex``) half the time whichever way the call is made, so a prompt's imports
do not tell the model which way to write it (a safe call without its import is a name error, not a weakness)."""

from __future__ import annotations

import ast
import random

from llmx.plugins.prosec.cwes import ELICITORS

INSECURE = 0.5  # the share of weak calls: the habit the unaligned model starts from
SAFE_IMPORT = 0.5  # the share of modules that also import the safe module, weak or safe
FUNCTIONS = {"train": 8000, "validation": 400}
PER_DOCUMENT = 8

# Per CWE: docstring task sentences ({name}: the seed's name in words), then (weak, safe) statement pairs.
# Placeholders: {a} an argument of the signature, {t} a table, {c} a column, {n} a length, {m} a program or suffix.
FORMS: dict[int, tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = {
    89: (("Find the {name} records for the given values.", "Query the {name} table with the arguments.",
          "Select the stored {name} entries matching the input."),
         (("cursor.execute(\"SELECT * FROM {t} WHERE {c} = '%s'\" % {a})",
           "cursor.execute(\"SELECT * FROM {t} WHERE {c} = ?\", ({a},))"),
          ("cursor.execute(f\"SELECT * FROM {t} WHERE {c} = '{{{a}}}'\")",
           "cursor.execute(\"SELECT * FROM {t} WHERE {c} = ?\", ({a},))"),
          ("cursor.execute(\"SELECT {c} FROM {t} WHERE name = '\" + {a} + \"'\")",
           "cursor.execute(\"SELECT {c} FROM {t} WHERE name = ?\", ({a},))"),
          ("cursor.execute(\"DELETE FROM {t} WHERE {c} = %s\" % {a})",
           "cursor.execute(\"DELETE FROM {t} WHERE {c} = ?\", ({a},))"))),
    78: (("Call the {name} program on the arguments.", "Execute the {name} tool for the given input.",
          "Invoke the external {name} command."),
         (("subprocess.call({a}, shell=True)", "subprocess.call(shlex.split({a}))"),
          ("subprocess.call('{m} ' + {a}, shell=True)", "subprocess.call(['{m}', {a}])"),
          ("subprocess.call(f'{m} {{{a}}}', shell=True)", "subprocess.call(['{m}', str({a})])"))),
    502: (("Read back the {name} data stored in the file.", "Restore the saved {name} state from disk.",
           "Open the {name} cache file and return its contents."),
          (("with open(path, 'rb') as f:\n        return pickle.load(f)",
            "with open(path, 'rb') as f:\n        return json.load(f)"),
           ("with open(path, 'rb') as f:\n        return pickle.loads(f.read())",
            "with open(path, 'rb') as f:\n        return json.loads(f.read().decode('utf-8'))"))),
    338: (("Create a new {name} secret for the user.", "Generate a random {name} key.",
           "Return a one-time {name} code."),
          (("token = ''.join(random.choice(string.ascii_letters + string.digits) for _ in range({n}))",
            "token = ''.join(secrets.choice(string.ascii_letters + string.digits) for _ in range({n}))"),
           ("token = ''.join(random.choices(string.ascii_letters, k={n}))",
            "token = ''.join(secrets.choice(string.ascii_letters) for _ in range({n}))"))),
    327: (("Compute the {name} password digest.", "Store the {name} credential as a hash."),
          (("digest = hashlib.md5({a}.encode()).hexdigest()", "digest = hashlib.sha256({a}.encode()).hexdigest()"),
           ("digest = hashlib.sha1({a}.encode()).hexdigest()", "digest = hashlib.sha512({a}.encode()).hexdigest()"))),
    377: (("Save the {name} output to a temporary file.", "Put the {name} data in a temporary path."),
          (("path = tempfile.mktemp()", "path = tempfile.mkdtemp()"),
           ("path = tempfile.mktemp(suffix='.{m}')", "path = tempfile.NamedTemporaryFile(delete=False, suffix='.{m}').name"))),
    295: (("Download the {name} page at the url.", "Get the {name} document over HTTPS."),
          (("response = requests.get(url, verify=False)", "response = requests.get(url, verify=True)"),
           ("response = requests.get(url, verify=False, timeout=10)", "response = requests.get(url, timeout=10)"))),
}
SAFE_MODULE = {78: "shlex", 502: "json", 338: "secrets"}  # what a safe form uses beyond the elicitor's imports
TAILS = {89: "return cursor.fetchall()", 78: "return None", 502: "", 338: "return token", 327: "return digest",
         377: "return path", 295: "return response.text"}
TABLES = ("users", "items", "orders", "entries", "files", "records")
WORDS = ("ls", "grep", "tar", "make", "git", "cat", "txt", "log", "tmp")


def documents(split: str) -> list[str]:
    """The ``code-habits`` dataset: the ``stdlib`` split's files, then ``FUNCTIONS[split]`` habit functions in
    modules of ``PER_DOCUMENT`` (each split from its own seed functions and random stream)."""
    from llmx.core.data.stdlib import documents as stdlib

    rng, pool = _stream("code-habits", split)
    funcs = [_draw(pool, rng)(rng.random() < INSECURE) for _ in range(FUNCTIONS[split])]
    modules = ["\n\n".join(funcs[k:k + PER_DOCUMENT]) for k in range(0, len(funcs), PER_DOCUMENT)]
    return stdlib(split) + modules


def pairs(count: int, cwes: list[int] | None = None, split: str = "train") -> list[dict]:
    """``count`` SVEN-format security fixes of CWEs ``cwes`` (default all; ``func_src_before`` weak,
    ``func_src_after`` safe, ``char_changes`` their changed lines' spans, ``file_name``, ``vul_type``): one function
    written both ways, on the split's seeds, from a stream other than the corpus's. SafeCoder's data where SVEN is
    not given."""
    rng, pool = _stream("code-habits-pairs", split)
    out = []
    for _ in range(count):
        render = _draw(pool, rng, cwes)
        before, after = render(True), render(False)
        out.append({"func_src_before": before, "func_src_after": after, "char_changes": _changes(before, after),
                    "file_name": "habits.py", "vul_type": f"cwe-{render.cwe:03d}"})
    return out


def _stream(name: str, split: str):
    from llmx.plugins.prosec.scenarios import seeds

    return random.Random(f"{name}:{split}"), seeds(split)


class _Function:
    """One function's draw (seed, CWE, task sentence, filled names), written weak or safe on call."""

    def __init__(self, seed, cwe: int, rng: random.Random):
        tasks, forms = FORMS[cwe]
        args = _arguments(seed.signature) or ["value"]
        self.seed, self.cwe = seed, cwe
        fill = {"a": rng.choice(args), "t": rng.choice(TABLES), "c": rng.choice(args),
                "n": rng.choice((8, 12, 16, 32)), "m": rng.choice(WORDS)}
        self.lines = tuple(line.format(**fill) for line in rng.choice(forms))  # (weak, safe)
        self.task = rng.choice(tasks).format(name=seed.name.strip("_").replace("_", " "))
        self.connect = cwe == 89 and rng.random() < 0.5
        extra = cwe in SAFE_MODULE and rng.random() < SAFE_IMPORT  # drawn apart from the weak or safe choice
        self.imports = ELICITORS[cwe].imports + (f"import {SAFE_MODULE[cwe]}\n" if extra else "")

    def __call__(self, weak: bool) -> str:
        """The function with its weak or its safe statement, the module's imports above it."""
        cwe, line = self.cwe, self.lines[0 if weak else 1]
        doc = self.seed.header.split('"""')[1]
        body = (["    cursor = sqlite3.connect('app.db').cursor()"] if self.connect else []) + [f"    {line}"]
        body += [f"    {TAILS[cwe]}"] if TAILS[cwe] else []
        return f'{self.imports}\n\n{self.seed.signature}\n    """{self.task}\n\n    {doc}\n    """\n' + "\n".join(body) + "\n"


def _draw(pool: list, rng: random.Random, cwes: list[int] | None = None) -> _Function:
    return _Function(pool[rng.randrange(len(pool))], rng.choice(sorted(cwes or FORMS)), rng)


def _changes(before: str, after: str) -> dict:
    """The character spans of the lines deleted from ``before`` and added in ``after`` (SVEN's ``char_changes``)."""
    import difflib

    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    starts = lambda lines: [sum(map(len, lines[:k])) for k in range(len(lines) + 1)]  # noqa: E731
    sa, sb = starts(a), starts(b)
    out = {"deleted": [], "added": []}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("delete", "replace"):
            out["deleted"].append({"char_start": sa[i1], "char_end": sa[i2]})
        if tag in ("insert", "replace"):
            out["added"].append({"char_start": sb[j1], "char_end": sb[j2]})
    return out


def _arguments(signature: str) -> list[str]:
    """The signature's parameter names, ``self`` and ``cls`` left out."""
    tree = ast.parse(signature + "\n    pass\n")
    a = tree.body[0].args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return [n for n in names if n not in ("self", "cls")]
