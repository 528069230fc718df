"""Run a comparison (``ComparisonSpec``): every arm and seed as a normal run folder under ``OUT/arms/ARM/seed-N``
(a rerun reuses a finished one with the same resolved config, so Ctrl-C loses nothing finished), the evaluation's
items paired on (seed, item), the target against each baseline with a two-level bootstrap interval of the paired
difference (``stats.clustered``), the verdict ("ahead" or "behind" only where the interval excludes zero; otherwise
"within noise"), and the results: ``result.json``, ``result.md`` and ``result.png`` (the metric against the cost, one
line per arm family). A finished run is reused only where its inputs are unchanged (``provenance``). Everything the
user can get wrong is checked before the first run."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmx.core import atomic
from llmx.core.compare import provenance
from llmx.core.compare.spec import Arm, ComparisonSpec
from llmx.core.eval import stats
from llmx.core.eval.items import FIELD
from llmx.errors import UsageError

RESULT = "result"
MIN_PAIRS = 20  # fewer paired items: no verdict (two items of one sign make any bootstrap interval exclude zero)
PROVENANCE = provenance.FILE


@dataclass
class Planned:
    arm: Arm
    seed: int
    folder: Path
    run: Any  # the ResolvedRun
    declared: float | None = None  # the arm's declared cost, while its stages are as declared
    inputs: dict[str, Any] = field(default_factory=dict)  # fingerprints of what it reads: a reuse must match


@dataclass
class Plan:
    spec: ComparisonSpec
    model: str
    data: dict[str, Any]
    seeds: tuple[int, ...]
    quick: bool
    out: Path
    options: dict[str, Any] = field(default_factory=dict)  # what the user changed: --data, --set, --device, ...
    runs: list[Planned] = field(default_factory=list)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "arm"


def model_for(spec: ComparisonSpec, model: str | None, quick: bool) -> str:
    return model or (spec.quick_model if quick else spec.model)


def folder_for(spec: ComparisonSpec, model: str | None, quick: bool, options: Mapping[str, Any]) -> str:
    """``MODEL[-quick][-DIGEST]``: a variant with options of its own (data, overrides, seeds, device) never writes
    over the comparison's own form."""
    name = slug(model_for(spec, model, quick)).strip(".-") + ("-quick" if quick else "")
    chosen = _options(spec, quick, options)
    if not chosen:
        return name
    return f"{name}-{hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:8]}"


def _options(spec: ComparisonSpec, quick: bool, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options that make a variant: those given, less seeds equal to the form's own."""
    default = list(spec.quick_seeds if quick else spec.seeds)
    return {k: v for k, v in options.items() if v and not (k == "seeds" and list(dict.fromkeys(v)) == default)}


def plan(spec: ComparisonSpec, *, out: str | Path, model: str | None = None, data: str | None = None,
         seeds: Sequence[int] | None = None, quick: bool = False, sets: Sequence[str] = (),
         device: str | None = None, dtype: str | None = None, onload: str | None = None) -> Plan:
    """Resolve every (arm, seed) run; a bad name, override, model or cost raises ``UsageError`` / ``ConfigError``
    here, before any work. ``device``, ``dtype`` and ``onload`` are the runs' (default: the run config's; ``dtype``:
    the comparison's where it sets one)."""
    from llmx.core.config import resolve
    from llmx.core.plugins import host

    if data is not None and not spec.corpus:
        raise UsageError(f"comparison '{spec.name}' reads data of its own: --data would not feed it",
                         hint=f"Give a stage its data with --set ARM.data=PATH (llmx compare show {spec.name}).")
    model = model_for(spec, model, quick)
    if model.startswith((".", "/", "~")) or model.count("/") > 1:  # a folder, not a hub id (org/name)
        if not Path(model).expanduser().exists():
            raise UsageError(f"model folder not found: {model}")
    if data and provenance.local_file(data) and not Path(data).expanduser().exists():
        raise UsageError(f"data file not found: {data}")
    _check_kind(spec, model)
    data_cfg = dict(spec.data) if data is None else {**spec.data, "source": data}
    chosen = tuple(dict.fromkeys(seeds)) if seeds else (spec.quick_seeds if quick else spec.seeds)
    methods = host().methods
    stages = {a.name: [copy.deepcopy(dict(s)) for s in a.stages] for a in spec.arms}
    evaluation = copy.deepcopy(dict(spec.evaluation)) if spec.evaluation else None
    if quick:
        for arm_stages in (*stages.values(), [evaluation] if evaluation else []):
            for s in arm_stages:
                _override(s, _quick_for(spec.quick, s["method"]), methods)
    before = copy.deepcopy(stages)  # the quick form changes every arm alike: declared costs still compare
    for item in sets:
        _apply_set(spec, item, stages, evaluation, methods)
    changed = {a.name for a in spec.arms if stages[a.name] != before[a.name]}
    _check_costs(spec, changed)
    options = {"data": data, "sets": list(sets), "seeds": list(seeds or []), "device": device, "dtype": dtype,
               "onload": onload}
    p = Plan(spec, model, data_cfg, chosen, quick, Path(out), _options(spec, quick, options))
    from llmx.core.pipeline import check_requirements

    for arm in spec.arms:
        for seed in chosen:
            folder = p.out / "arms" / slug(arm.name) / f"seed-{seed}"
            raw = {"name": f"{spec.name}-{slug(arm.name)}", "model": model, "seed": seed, "data": dict(data_cfg),
                   **({"threads": 1} if quick else {}),  # a smoke check on a shared machine: no oversubscription
                   **({"dtype": dtype or spec.dtype} if dtype or spec.dtype else {}),
                   **({"device": device} if device else {}), **({"onload": onload} if onload else {}),
                   **({"zoo": dict(spec.quick_zoo)} if spec.quick_zoo and model == spec.quick_model else {}),
                   "output_dir": str(folder),
                   "pipeline": [*copy.deepcopy(stages[arm.name]), *([dict(evaluation)] if evaluation else [])]}
            resolved = resolve(raw, methods)
            check_requirements(resolved)  # a missing package or device: exit 3 before the first arm runs
            p.runs.append(Planned(arm, seed, folder, resolved, None if arm.name in changed else arm.cost,
                                  provenance.inputs(resolved.to_dict())))
    return p


def _quick_for(quick: Mapping[str, Any], method: str) -> dict[str, Any]:
    """The quick overrides for a stage running ``method``: bare keys (every stage with the field) and ``METHOD.key``
    (only that method's stages, where two methods share a field name)."""
    out = {k: v for k, v in quick.items() if "." not in k}
    out.update({k.split(".", 1)[1]: v for k, v in quick.items() if k.split(".", 1)[0] == method and "." in k})
    return out


def _check_kind(spec: ComparisonSpec, model: str) -> None:
    if not spec.kinds:
        return
    from llmx.core.models.meta import model_kind

    kind = model_kind(model)
    if kind not in spec.kinds:
        raise UsageError(f"comparison '{spec.name}' runs on {', '.join(spec.kinds)} models; {model} is {kind}")


def _fields(stage: dict, methods) -> set[str]:
    """The params of the stage's method, for the stage it runs as (a name may serve several stages)."""
    return set(methods.get(stage["method"], stage.get("stage")).config.model_fields)


def _override(stage: dict, values: dict[str, Any], methods) -> bool:
    """Set each of ``values`` the stage's method has as a param; whether any was set."""
    known = _fields(stage, methods)
    hit = {k: v for k, v in values.items() if k in known}
    stage.setdefault("params", {}).update(hit)
    return bool(hit)


def _apply_set(spec: ComparisonSpec, item: str, stages: dict[str, list[dict]], evaluation: dict | None,
               methods) -> None:
    """``ARM.KEY=VALUE``, ``ARM.METHOD.KEY=VALUE`` or ``ARM.N.KEY=VALUE`` (the arm's stage N, from 0; ``*`` for every
    arm, ``eval`` for the evaluation): the param of the arm's stage that has it. An ``ARM.KEY`` that more than one
    stage of one arm has is refused (CROW's arm plants a backdoor before it defends: ``crow.epochs`` must say
    which)."""
    from llmx.core.config import parse_set
    from llmx.core.names import normalize

    keys, value = parse_set(item)
    if len(keys) not in (2, 3):
        raise UsageError(f"--set {item!r}: expected ARM.KEY=VALUE or ARM.METHOD.KEY=VALUE (ARM: an arm's name, '*' "
                         "for every arm, or 'eval')")
    who, key, method = keys[0], keys[-1], keys[1] if len(keys) == 3 else None
    if who == "eval":
        if evaluation is None:
            raise UsageError(f"--set {item!r}: comparison '{spec.name}' has no separate evaluation stage")
        arms = [[evaluation]]
    elif who == "*":
        arms = list(stages.values())
    else:
        arms = [stages[spec.arm(who).name]]
    hit = False
    for arm in arms:
        chosen = ([arm[int(method)]] if method is not None and method.isdigit() and int(method) < len(arm) else
                  [s for s in arm if method is None or normalize(s["method"]) == normalize(method)])
        having = [s for s in chosen if key in _fields(s, methods)]
        if len(having) > 1:
            raise UsageError(f"--set {item!r}: stages {', '.join(s['method'] for s in having)} of {who!r} all have "
                             f"'{key}'", hint=f"Name the stage: --set {who}.METHOD.{key}=... or {who}.N.{key}=... "
                             f"(llmx compare show {spec.name} lists the stages).")
        hit |= any([_override(s, {key: value}, methods) for s in having])
    if not hit:
        where = (f" (its stages are 0-{len(arms[0]) - 1})" if method and method.isdigit() and len(arms) == 1 else
                 f" running {method}" if method else "")
        raise UsageError(f"--set {item!r}: no stage of {who!r}{where} has a param '{key}'")


def _check_costs(spec: ComparisonSpec, changed: set[str]) -> None:
    """Declared costs must match the target's within the tolerance. An arm whose stages ``--set`` or the quick form
    changed has no declared cost any more: it is measured after its run (``cost_key``), or left unjudged."""
    if spec.tolerance is None or spec.target in changed:
        return
    target = spec.arm(spec.target)
    for arm in map(spec.arm, spec.judged):
        if arm.cost is None or target.cost is None or arm.name in changed:
            continue
        if not spec.matched(arm.cost, target.cost):
            raise UsageError(f"comparison '{spec.name}': arm '{arm.name}' costs {arm.cost:g} {spec.cost} against "
                             f"the target's {target.cost:g} (tolerance {spec.tolerance:g}"
                             f"{' of it' if spec.relative else ''}): not matched")


def run(p: Plan, progress: bool = True, say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Run (or reuse) every planned run, then pair, judge and write the results; returns the result."""
    rows: dict[str, list[dict[str, Any]]] = {a.name: [] for a in p.spec.arms}
    for i, planned in enumerate(p.runs, 1):
        folder = _finished(planned)
        if folder is None:
            say(f"[{i}/{len(p.runs)}] {planned.arm.name}, seed {planned.seed}: running")
            folder = _execute(planned, progress)
        else:
            say(f"[{i}/{len(p.runs)}] {planned.arm.name}, seed {planned.seed}: reused {folder.name}")
        rows[planned.arm.name].append(_collect(p.spec, planned, folder))
    result = _judge(p, rows)
    write(p.out, result)
    return result


def _finished(planned: Planned) -> Path | None:
    """The newest finished run of this config whose inputs are unchanged (its ``compare.json`` matches)."""
    digest = planned.run.digest()
    for folder in sorted(planned.folder.glob(f"*_{digest}"), reverse=True):
        try:
            if (json.loads((folder / "meta.json").read_text()).get("status") == "ok"
                    and json.loads((folder / PROVENANCE).read_text()).get("inputs") == planned.inputs):
                return folder
        except (OSError, ValueError):
            continue
    return None


def _execute(planned: Planned, progress: bool) -> Path:
    from llmx.core.pipeline import execute

    folder = Path(execute(planned.run, show_progress=progress).path)
    atomic.write_json(folder / PROVENANCE, {"inputs": planned.inputs, "machine": _machine()})
    return folder


def _collect(spec: ComparisonSpec, planned: Planned, folder: Path) -> dict[str, Any]:
    stages = json.loads((folder / "metrics.json").read_text())["stages"]
    last = stages[-1]
    items_file = folder / "artifacts" / f"{last['index']}_{last['method']}" / spec.items
    if not items_file.is_file():
        raise UsageError(f"{folder}: the evaluation wrote no {spec.items} to pair items on")
    rows = [json.loads(line) for line in items_file.read_text().splitlines() if line.strip()]
    if any(FIELD not in r for r in rows):
        raise UsageError(f"{items_file}: a row has no '{FIELD}' id to pair on")
    seen: dict[str, int] = {}
    items = {}
    extra: dict[str, dict] = {f: {} for f in (*spec.report, *([spec.by] if spec.by else []))}
    for r in rows:  # the k-th row of one item id pairs with the k-th of the same id (a prompt asked twice)
        seen[r[FIELD]] = seen.get(r[FIELD], -1) + 1
        items[(r[FIELD], seen[r[FIELD]])] = r[spec.metric]
        for f in extra:
            if r.get(f) is not None:
                extra[f][(r[FIELD], seen[r[FIELD]])] = r[f]
    cost = planned.declared
    if cost is None and spec.cost_key:
        method, _, name = spec.cost_key.partition(".")  # METHOD.key: that method's stage (another may share the key)
        if not name or all(s["method"] != method for s in stages):  # no such method here: a plain key
            method, name = "", spec.cost_key
        cost = next((s["metrics"][name] for s in stages
                     if s["metrics"].get(name) is not None and method in ("", s["method"])), None)
    meta = json.loads((folder / "meta.json").read_text())
    made = json.loads((folder / PROVENANCE).read_text()) if (folder / PROVENANCE).is_file() else {}
    return {"seed": planned.seed, "run_dir": str(folder), "value": last["metrics"].get(spec.metric),
            "cost": cost, "items": items, **({"extra": extra} if extra else {}),
            **{key: {c: next((s["metrics"][c] for s in stages if s["metrics"].get(c) is not None), None) for c in names}
               for key, names in (("counts", spec.counts), ("diagnostics", spec.diagnostics)) if names},
            "split": last["metrics"].get("split"),
            "machine": made.get("machine"), "git_commit": meta.get("git_commit"),
            "llmx": meta.get("versions", {}).get("llmx"), "seconds": meta.get("seconds")}


def _judge(p: Plan, rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    spec = p.spec
    sign = 1.0 if spec.higher_is_better else -1.0
    target = {r["seed"]: r["items"] for r in rows[spec.target]}
    verdicts = []
    target_cost = _mean_cost(rows[spec.target])
    void = {r["seed"]: [c for c, v in r["counts"].items() if v == 0] for r in rows[spec.target] if r.get("counts")}
    void = {seed: names for seed, names in void.items() if names}  # seeds whose data stage made nothing
    for arm in map(spec.arm, spec.judged):
        cost = _mean_cost(rows[arm.name])
        if spec.tolerance is not None and (cost is None or target_cost is None):
            unmatched = f"unmatched: {spec.cost} unknown (changed and not measured)"
        elif cost is not None and target_cost is not None and not spec.matched(cost, target_cost):
            unmatched = f"unmatched: {cost:.3g} against {target_cost:.3g} {spec.cost}"
        else:
            unmatched = ""
        if unmatched:
            verdicts.append({"baseline": arm.name, "improvement": None, "low": None, "high": None,
                             "verdict": unmatched, "pairs": 0, "seeds": 0})
            continue
        verdicts.append(_void(spec, _verdict(arm.name, target, rows[arm.name], sign), void, len(rows[spec.target])))
    arms = []
    for arm in spec.arms:
        runs = [{k: v for k, v in r.items() if k not in ("items", "extra")} for r in rows[arm.name]]
        values = [r["value"] for r in runs if r["value"] is not None]
        arms.append({"name": arm.name, "family": arm.line, "target": arm.name == spec.target,
                     "cost": _mean_cost(runs),
                     spec.metric: sum(values) / len(values) if values else None, "runs": runs,
                     **_reported(spec, rows[arm.name])})
    return {"comparison": spec.name, "summary": spec.summary, "paper": spec.paper, "model": p.model, "data": p.data,
            "seeds": list(p.seeds), "quick": p.quick, "options": p.options, "default_model": spec.model,
            "split": ", ".join(sorted({str(r["split"]) for runs in rows.values() for r in runs if r.get("split")}))
            or None,
            "metric": spec.metric, "higher_is_better": spec.higher_is_better,
            "cost": spec.cost, "target": spec.target, "arms": arms, "verdicts": verdicts, "machine": _machine(),
            **({"by": spec.by} if spec.by else {}),
            "run_machines": _distinct([r["machine"] for runs in rows.values() for r in runs if r["machine"]]),
            "improvement": f"{'target - baseline' if spec.higher_is_better else 'baseline - target'} in {spec.metric}, "
                           "per item, paired on (seed, item); interval: seeds then items resampled (95%)"}


def _void(spec: ComparisonSpec, verdict: dict[str, Any], void: dict[int, list[str]], seeds: int) -> dict[str, Any]:
    """A verdict where the target's data stage made nothing (a ``counts`` metric of 0: its training was skipped, so
    on those seeds the target is the model it started from) says so: ``void_seeds``, and in the verdict's words;
    every seed void is no verdict about the target at all."""
    if not void:
        return verdict
    what = ", ".join(sorted({c for names in void.values() for c in names}))
    if len(void) >= seeds:
        return {**verdict, "void_seeds": sorted(void), "verdict": f"void: {spec.target} made no {what} on any seed "
                f"(its runs are the starting model; the interval is not about {spec.target})"}
    return {**verdict, "void_seeds": sorted(void), "verdict": f"{verdict['verdict']}; {spec.target} untrained on "
            f"seed{'s' if len(void) > 1 else ''} {', '.join(map(str, sorted(void)))} ({what} 0)"}


def _spread(groups: list[list[float]], crossed: bool) -> tuple[float, float, float]:
    """The mean of ``groups`` (one per seed) and its 95% interval: the wider of the two-level bootstrap
    (``stats.clustered``) and, with 2 seeds or more, a t-interval on the per-seed means, which the bootstrap
    under-covers with few seeds."""
    mean, low, high = stats.clustered(groups, seed=0, crossed=crossed)
    return stats.widened(mean, low, high, [sum(g) / len(g) for g in groups])


def _interval(groups: list[dict[Any, float]], share: bool = False) -> dict[str, Any]:
    """An arm's mean over (seed, item) and its 95% interval (``_spread``: seeds then items resampled, items crossed
    with the seeds only where every seed scored the same ones), with the item count; ``groups``: item -> value per
    seed. A ``share``'s interval is held in [0, 1], where the t-widening can otherwise reach past its bounds."""
    groups = [g for g in groups if g]
    if not groups:
        return {"mean": None, "low": None, "high": None, "items": 0}
    keys = [sorted(g) for g in groups]
    mean, low, high = _spread([[g[k] for k in order] for g, order in zip(groups, keys, strict=True)],
                              all(k == keys[0] for k in keys))
    if share:
        low, high = max(low, 0.0), min(high, 1.0)
    return {"mean": mean, "low": low, "high": high, "items": sum(map(len, groups))}


def _group_order(g: str) -> tuple:
    """Numbers by value first (CWE 78 before 502), then the rest by name."""
    try:
        return (0, float(g), g)
    except ValueError:
        return (1, 0.0, g)


def _reported(spec: ComparisonSpec, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The spec's ``report`` fields and its metric ``by`` a field, for one arm's runs (nothing where it has none).
    Groups are the field's values as text (89 and "89" are one group, as in the JSON written)."""
    out: dict[str, Any] = {}
    if spec.report:
        out["report"] = {f: _interval([r["extra"][f] for r in rows], f in spec.shares) for f in spec.report}
    if spec.by:
        groups = sorted({str(v) for r in rows for v in r["extra"][spec.by].values()}, key=_group_order)
        out["by"] = {g: _interval([{k: v for k, v in r["items"].items() if str(r["extra"][spec.by].get(k)) == g}
                                   for r in rows], spec.metric in spec.shares) for g in groups}
    return out


def _verdict(name: str, target: dict[int, dict], rows: list[dict[str, Any]], sign: float) -> dict[str, Any]:
    """The target against one baseline: the mean paired difference and its interval, the wider of the two-level
    bootstrap and (with 2 seeds or more) a t-interval on the per-seed means, which the bootstrap under-covers with
    few seeds. "ahead"/"behind" only where the interval excludes zero over at least ``MIN_PAIRS`` distinct items;
    one seed's verdict covers item noise only, and says so."""
    groups, keys, bad = [], [], []
    for r in rows:
        t = target[r["seed"]]
        if t.keys() != r["items"].keys():
            bad.append(f"seed {r['seed']}: {len(r['items'].keys() - t.keys())} items the target did not score, "
                       f"{len(t.keys() - r['items'].keys())} of its {len(t)} missing")
            continue
        order = sorted(t)
        keys.append(order)
        groups.append([sign * (t[k] - r["items"][k]) for k in order])
    out = {"baseline": name, "improvement": None, "low": None, "high": None, "pairs": sum(len(g) for g in groups),
           "seeds": len(groups)}
    if bad:  # a --set on one arm changed what it scored (a length, a source, an instance): no verdict for it
        return {**out, "pairs": 0, "verdict": "unpaired: " + "; ".join(bad)}
    crossed = all(k == keys[0] for k in keys)  # every seed scored the same items: cross them with the seeds
    distinct = min(map(len, keys), default=0)  # seeds repeating a handful of items add no evidence about others
    if distinct < MIN_PAIRS:
        return {**out, "verdict": f"too few items ({distinct} per seed)"}
    diff, low, high = _spread(groups, crossed)
    verdict = "ahead" if low > 0 else "behind" if high < 0 else "within noise"
    verdict += " (one seed)" if len(groups) == 1 else ""
    return {**out, "improvement": diff, "low": low, "high": high, "verdict": verdict}


def _mean_cost(runs: list[dict[str, Any]]) -> float | None:
    costs = [r["cost"] for r in runs if r["cost"] is not None]
    return sum(costs) / len(costs) if costs else None


def _distinct(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _machine() -> dict[str, Any]:
    from llmx.core.machine import machine

    m = machine()
    return {k: m[k] for k in ("cpu_model", "torch_cpu_capability", "cuda", "torch", "threads", "cpus")}


def markdown(result: dict[str, Any]) -> str:
    metric = result["metric"]
    lines = [f"# {result['comparison']}", "", result["summary"], "",
             f"Model {result['model']}, data {result['data'].get('source')}"
             f"{' (scored on its ' + result['split'] + ' split)' if result.get('split') else ''}, seeds {result['seeds']}"
             f"{' (quick form)' if result['quick'] else ''}"
             f"{'; options ' + json.dumps(result['options']) if result.get('options') else ''}. {metric}: "
             f"{'higher' if result['higher_is_better'] else 'lower'} is better.", "",
             f"| arm | family | {result['cost']} | {metric} | improvement of {result['target']} | verdict |",
             "|---|---|---|---|---|---|"]
    by_name = {v["baseline"]: v for v in result["verdicts"]}
    for a in result["arms"]:
        v = by_name.get(a["name"])
        cell = (f"{v['improvement']:+.4f} [{v['low']:+.4f}, {v['high']:+.4f}]" if v and v["improvement"] is not None
                else "-" if v else "(target)" if a["target"] else "(reference)")
        cost = "-" if a["cost"] is None else f"{a['cost']:.3g}"
        value = "-" if a[metric] is None else f"{a[metric]:.4f}"
        lines.append(f"| {a['name']} | {a['family']} | {cost} | {value} | {cell} | {v['verdict'] if v else ''} |")
    lines += _reported_md(result)
    from llmx.core.compare.summary import where

    judged = len(result["verdicts"])
    lines += ["", f"Improvement: {result['improvement']}."
              + (f" Each interval is 95% on its own: no correction across the {judged} baselines." if judged > 1
                 else ""), "", "Runs made on: " + "; ".join(
        f"{where(m)}, torch {m.get('torch')}" for m in result.get("run_machines") or [result["machine"]]) + "."]
    return "\n".join(lines) + "\n"


def _reported_md(result: dict[str, Any]) -> list[str]:
    """The per-arm table of the reported fields and of the metric by group: mean [95% interval], not judged."""
    arms = [a for a in result["arms"] if a.get("report") or a.get("by")]
    if not arms:
        return _per_seed_md(result)
    fields = list(arms[0].get("report", {}))
    groups = list(dict.fromkeys(g for a in arms for g in a.get("by", {})))
    by = result.get("by") or "group"
    heads = fields + [f"{result['metric']} ({by} {g})" for g in groups]

    def cell(x: dict[str, Any] | None) -> str:
        return "-" if not x or x["mean"] is None else f"{x['mean']:.4f} [{x['low']:.4f}, {x['high']:.4f}]"

    lines = ["", "Per arm, mean [95% interval over seeds then items], not judged:", "",
             "| arm | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for a in arms:
        cells = [cell(a.get("report", {}).get(f)) for f in fields] + [cell(a.get("by", {}).get(g)) for g in groups]
        lines.append(f"| {a['name']} | " + " | ".join(cells) + " |")
    return lines + _per_seed_md(result)


def _per_seed_md(result: dict[str, Any]) -> list[str]:
    """Each arm's counts and diagnostics, per seed."""
    lines: list[str] = []
    for a in result["arms"]:
        for key in ("counts", "diagnostics"):
            per = [(r["seed"], r[key]) for r in a["runs"] if any(v is not None for v in r.get(key, {}).values())]
            if per:
                lines += ["", f"{a['name']}, per seed: " + "; ".join(
                    f"seed {seed}: " + ", ".join(f"{k} {_figure(v)}" for k, v in c.items()) for seed, c in per) + "."]
    return lines


def _figure(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(out / f"{RESULT}.json", result)
    atomic.write_text(out / f"{RESULT}.md", markdown(result))
    _plot(out / f"{RESULT}.png", result)


def _plot(path: Path, result: dict[str, Any]) -> None:
    """The metric against the cost, one line per family; nothing without matplotlib (``llmx[plot]``)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = result["metric"]
    fig, ax = plt.subplots(figsize=(6, 4))
    families: dict[str, list[tuple[float, float, str]]] = {}
    for a in result["arms"]:
        if a["cost"] is not None and a[metric] is not None:
            families.setdefault(a["family"], []).append((a["cost"], a[metric], a["name"]))
    for family, points in sorted(families.items()):
        points.sort()
        ax.plot([c for c, _, _ in points], [v for _, v, _ in points], marker="o", label=family)
    ax.set_xlabel(result["cost"])
    ax.set_ylabel(metric)
    ax.set_title(result["comparison"])
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
