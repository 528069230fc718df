"""Run configuration: pydantic models, merging, ``--set`` overrides and two-pass validation.

Precedence (lowest first): method defaults < ``--config`` files (deep merge, lists replace) <
dedicated flags < ``--set key=value``. Validation is two-pass: the run, then each stage's params
against its method's model; every problem is reported at once with its dotted path.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmx.core.data import SplitMode
from llmx.core.names import did_you_mean, normalize
from llmx.core.refs import ModelRef, TextSource
from llmx.core.registry import MethodRegistry
from llmx.core.spec import MethodSpec, Params, Stage
from llmx.errors import ConfigError, Problem, UsageError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StageConfig(_Strict):
    """One pipeline step: a method, the stage it serves (default: its first), and its params."""

    method: str = Field(description="Method name or alias (see `llmx methods`).")
    stage: Stage | None = Field(None, description="Stage to run the method as; defaults to the method's first stage.")
    params: dict[str, Any] = Field(default_factory=dict, description="The method's parameters.")


class DataConfig(_Strict):
    """The default text corpus for calibration and evaluation."""

    source: TextSource = Field("stdlib", description="Dataset name (see `llmx env`) or a local .txt/.jsonl path.")
    split: Literal["train", "validation"] = "validation"
    seq_len: int = Field(128, gt=0, description="Tokens per sequence.")
    max_tokens: int | None = Field(None, gt=0, description="Cap on the tokens read from the source.")
    text_split: SplitMode = Field(
        "auto", description="How a local .txt/.jsonl file splits: by a hash of each blank-line block or line (auto "
        "picks), or of each row; legacy: a .txt's last validation_percent, .jsonl rows by file name and index.")
    validation_percent: int = Field(10, ge=1, le=50, description="A local file's share held out for validation.")

    @property
    def splitting(self):
        from llmx.core.data import TextSplit

        return TextSplit(self.text_split, self.validation_percent)


class RunConfig(_Strict):
    """A whole run: where it writes, what it loads, and the stages it applies in order."""

    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    seed: int = 0
    device: str = Field("cpu", pattern=r"^(cpu|auto|mps|cuda(:\d+)?)$")
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    onload: Literal["none", "cpu"] = Field(
        "none", description="Where the decoder blocks' weights stay: none (all on the device), cpu (in CPU memory; "
        "each block moves to the device for its forward, then back: models larger than the device).")
    threads: int | None = Field(None, ge=1, description="torch threads; unset keeps torch's default.")
    output_dir: str = "runs"
    model: ModelRef | None = Field(None, description="HF id, local path, tiny:NAME or ref:NAME.")
    data: DataConfig = Field(default_factory=DataConfig)
    zoo: dict[str, Any] | None = Field(None, description="A reference model to build (or reuse) before the first "
                                       "stage, with the options of `llmx zoo build` and a name: load it with "
                                       "model: ref:NAME.")
    pipeline: list[StageConfig] = Field(min_length=1)


RUN_KEYS = tuple(RunConfig.model_fields)


@dataclass
class ResolvedStage:
    index: int
    stage: Stage
    spec: MethodSpec
    params: Params

    @property
    def label(self) -> str:
        return f"{self.index}:{self.spec.name}"


@dataclass
class ResolvedRun:
    config: RunConfig
    stages: list[ResolvedStage]
    zoo: Any = None  # the RefRequest of config.zoo

    def to_dict(self) -> dict[str, Any]:
        """The resolved config, defaults filled in: re-runnable as is with ``llmx run``."""
        data = self.config.model_dump(mode="json")
        data["pipeline"] = [
            {"method": s.spec.name, "stage": s.stage.value, "params": s.params.model_dump(mode="json")}
            for s in self.stages
        ]
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def digest(self) -> str:
        """Eight hex digits of the resolved config (where it is written excluded): part of the run folder's name."""
        blob = json.dumps({k: v for k, v in self.to_dict().items() if k != "output_dir"}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:8]


def route_data(raw: dict[str, Any], stage: Stage, data: str, methods: MethodRegistry) -> dict[str, Any]:
    """``--data`` of a stage command: the method's own ``data`` param where its params have one (align's preference
    rows, sft's rows, lm's corpus), else the run's text corpus (``data.source``)."""
    entry = raw["pipeline"][0]
    try:
        takes = "data" in methods.get(entry["method"], stage).config.model_fields
    except UsageError:  # an unknown method: resolving the run reports it with a did-you-mean
        takes = False
    if takes:
        entry["params"]["data"] = data
        return raw
    return deep_merge(raw, {"data": {"source": data}})


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read one config file; a missing, unparsable or non-mapping file is a UsageError."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"config file not found: {p}")
    try:
        from llmx.core.data.files import read_text

        data = yaml.safe_load(read_text(p))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise UsageError(f"{p}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; lists and scalars in ``override`` replace those in ``base``."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_set(item: str) -> tuple[list[str], Any]:
    """``a.b=c=d`` -> (["a", "b"], "c=d"). Values stay strings (pydantic coerces them by field type);
    a value starting with ``[`` or ``{`` is read as JSON so lists and mappings can be given."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
    parsed: Any = value
    if value[:1] in ("[", "{"):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--set {key}: value is not valid JSON: {exc.msg}") from exc
    return [k for k in key.strip().split(".")], parsed


def apply_sets(raw: dict[str, Any], items: list[str], default_stage: int | None = None) -> dict[str, Any]:
    """Apply ``--set`` overrides. ``METHOD.param`` addresses the first stage running METHOD; with
    ``default_stage``, a bare key that is not a run field is a param of that stage
    (``--set group_size=64`` means ``pipeline.N.params.group_size``)."""
    out = copy.deepcopy(raw)
    stages = out.get("pipeline") if isinstance(out.get("pipeline"), list) else []
    by_method: dict[str, int] = {}
    for i, entry in enumerate(stages):
        if isinstance(entry, dict) and isinstance(entry.get("method"), str):
            by_method.setdefault(normalize(entry["method"]), i)
    for item in items:
        path, value = parse_set(item)
        if len(path) > 1 and path[0] not in RUN_KEYS and normalize(path[0]) in by_method:
            path = ["pipeline", str(by_method[normalize(path[0])]), "params", *path[1:]]
        elif default_stage is not None and path[0] not in RUN_KEYS:
            path = ["pipeline", str(default_stage), "params", *path]
        _assign(out, path, value, item)
    return out


def _assign(obj: Any, path: list[str], value: Any, item: str) -> None:
    for i, part in enumerate(path):
        last = i == len(path) - 1
        if isinstance(obj, list):
            if not part.isdigit() or int(part) >= len(obj):
                raise UsageError(f"--set {item}: no list item {part!r} at {'.'.join(path[:i]) or 'top'}")
            if last:
                obj[int(part)] = value
            else:
                obj = obj[int(part)]
        elif isinstance(obj, dict):
            if last:
                obj[part] = value
            else:
                obj = obj.setdefault(part, {})
        else:
            raise UsageError(f"--set {item}: {'.'.join(path[:i])} is a value, not a section")


def resolve(raw: dict[str, Any], methods: MethodRegistry, source: str | None = None,
            folder: Path | None = None) -> ResolvedRun:
    """Validate the run, then each stage's params against its method; raise ConfigError with all problems.
    ``folder``: the recipe's, from which its relative paths resolve."""
    problems: list[Problem] = []
    config = None
    try:
        config = RunConfig.model_validate(raw)
    except ValidationError as exc:
        problems += _problems(exc, RunConfig, ())
    raw_stages = raw.get("pipeline") if isinstance(raw.get("pipeline"), list) else []
    broken = {p.path.split(".")[1] for p in problems if p.path.startswith("pipeline.")}
    stages: list[ResolvedStage] = []
    for i, raw_stage in enumerate(raw_stages):
        if str(i) in broken or not isinstance(raw_stage, dict):
            continue
        stage_cfg = StageConfig.model_validate(raw_stage)
        prefix = ("pipeline", i)
        try:
            spec = methods.get(stage_cfg.method, stage_cfg.stage)
        except UsageError as exc:
            problems.append(Problem(_dotted(prefix + ("method",)), exc.message))
            continue
        try:
            params = spec.config.model_validate(stage_cfg.params)
        except ValidationError as exc:
            problems += _problems(exc, spec.config, prefix + ("params",))
            continue
        stages.append(ResolvedStage(i, stage_cfg.stage or spec.stages[0], spec, params))
    if config is not None and config.onload != "none":
        problems += _onload_problems(config.onload, stages)
    problems += _pipeline_problems(stages)
    zoo = _zoo_request(raw.get("zoo"), problems)
    if zoo is not None and config is not None and config.model != f"ref:{zoo.name}":
        problems.append(Problem("model", f"the zoo section builds ref:{zoo.name}; load it with model: ref:{zoo.name}"))
    if problems:
        raise ConfigError(problems, source=source)
    assert config is not None
    run = ResolvedRun(config, stages, zoo)
    if folder is not None:
        from llmx.core.refs import rebase_run

        rebase_run(run, folder)
    return run


def _pipeline_problems(stages: list[ResolvedStage]) -> list[Problem]:
    """What a stage needs from the stages before it (``params.pipeline_problem(earlier)`` returns why it lacks it,
    e.g. a decode stage whose default input an earlier stage writes), found before any work."""
    out = []
    for k, s in enumerate(stages):
        check = getattr(s.params, "pipeline_problem", None)
        why = check(stages[:k]) if check else None
        if why:
            out.append(Problem(f"pipeline.{s.index}.params", why))
    return out


def _onload_problems(onload: str, stages: list[ResolvedStage]) -> list[Problem]:
    """A stage runs onloaded only where its params say it can (``onload_problem()`` returns None): others read or
    change weights outside a block's forward."""
    out = []
    for s in stages:
        check = getattr(s.params, "onload_problem", None)
        why = check() if check else "it works on the whole model's weights, not block by block"
        if why:
            out.append(Problem(f"pipeline.{s.index}.method", f"{s.spec.name} cannot run with onload {onload}: {why}; "
                               "use onload none"))
    return out


def _zoo_request(raw: Any, problems: list[Problem]) -> Any:
    """The ``zoo:`` section as a RefRequest; its mistakes join ``problems``."""
    if not isinstance(raw, dict):
        return None
    from llmx.core.zoo.request import RefRequest

    if not raw.get("name"):
        problems.append(Problem("zoo.name", "name the reference model, then load it with model: ref:NAME"))
        return None
    try:
        return RefRequest(**raw)
    except ValidationError as exc:
        problems += [Problem(_dotted(("zoo", *e["loc"])), e["msg"]) for e in exc.errors()]
    except UsageError as exc:
        problems.append(Problem("zoo", exc.message))
    return None


def _dotted(loc: tuple) -> str:
    return ".".join(str(p) for p in loc)


def _problems(exc: ValidationError, model: type[BaseModel], prefix: tuple) -> list[Problem]:
    out = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        path = _dotted(prefix + loc)
        if err["type"] == "extra_forbidden":
            allowed = _fields_at(model, loc[:-1])
            msg = f"unknown key '{loc[-1]}'.{did_you_mean(str(loc[-1]), allowed)}"
            if allowed:
                msg += f" Allowed: {', '.join(allowed)}."
        elif err["type"] == "missing":
            msg = "required"
        else:
            msg = err["msg"].removeprefix("Value error, ")
            if "input" in err and not isinstance(err["input"], (dict, list)):
                msg += f" (got {err['input']!r})"
        out.append(Problem(path, msg))
    return out


def _fields_at(model: Any, loc: tuple) -> list[str]:
    """Field names of the pydantic model reached by following ``loc`` from ``model``."""
    for part in loc:
        if isinstance(part, int):
            args = get_args(model)
            model = args[0] if args else None
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return []
        model = model.model_fields[part].annotation
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []
