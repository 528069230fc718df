"""``llmx compare [list | show NAME | NAME]``: the comparisons plugins declare, run on your model and data."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmx.cli import options as o
from llmx.cli.app import examples
from llmx.cli.output import emit, info, stdout, table


def compare(
    words: Annotated[Optional[list[str]], typer.Argument(
        help="list | show NAME | NAME | summary [PATH...]", show_default=False)] = None,
    model: o.Model = None,
    data: o.Data = None,
    device: o.Device = None,
    dtype: o.Dtype = None,
    onload: o.Onload = None,
    seeds: Annotated[Optional[list[str]], typer.Option(
        "--seeds", help="Seeds (default: the comparison's; --quick: its quick seeds), e.g. --seeds 0 1 2.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="The comparison's quick form (CI sizes, one seed).")] = False,
    sets: Annotated[Optional[list[str]], typer.Option(
        "--set", "-s", help="ARM.KEY=VALUE, or ARM.METHOD.KEY / ARM.N.KEY for one stage of a longer arm ('*' every "
        "arm, 'eval' the evaluation).")] = None,
    output_dir: Annotated[Optional[str], typer.Option(
        "--output-dir", "-o", help="Where comparisons go (default comparisons/): OUT/NAME/MODEL[-quick][-DIGEST of "
        "your options].")] = None,
) -> None:
    """Run the comparison a paper makes: its method beside its baselines, each arm and seed a run folder (a rerun
    reuses the finished ones), paired on the same items, with a verdict only where the interval excludes zero.
    ``summary`` tabulates the results already written (default: under comparisons/)."""
    from llmx.core.plugins import host
    from llmx.errors import UsageError

    words = list(words or ["list"])
    if words == ["list"]:
        data_ = [_row(s) for s in sorted(host().comparisons.values(), key=lambda s: s.name)]
        emit(data_, lambda: table("comparisons (llmx compare show NAME for the arms)", ["name", "target", "arms", "cost",
                                                                                 "plugin"],
                                  [[d["name"], d["target"], len(d["arms"]), d["cost"], d["plugin"]] for d in data_]))
        return
    if words[0] == "summary":
        from llmx.core.compare import summary

        results = summary.load(words[1:] or ["comparisons"])
        rows = summary.rows(results)
        emit(rows, lambda: table("comparisons: the target against each baseline", [
            "comparison", "target vs baseline", "metric", "improvement [95%]", "verdict", "model, seeds", "machine"],
            [[r["comparison"], f"{r['target']} vs {r['baseline']}", r["metric"], summary.cell(r), r["verdict"],
              f"{r['model']}, {len(r['seeds'])} seeds{' (quick)' if r['quick'] else ''}"
              f"{' (variant: ' + summary.variant(r) + ')' if r['options'] else ''}", "; ".join(r["machines"])]
             for r in rows]))
        return
    if words[0] == "show":
        if len(words) != 2:
            raise UsageError("usage: llmx compare show NAME")
        _show(host().comparison(words[1]).describe())
        return
    name, extra = words[0], words[1:]
    if extra and not (seeds and all(w.lstrip("-").isdigit() for w in extra)):
        raise UsageError(f"unexpected arguments: {' '.join(extra)}", hint="usage: llmx compare NAME [--seeds 0 1 2]")
    try:
        chosen = [int(x) for w in [*(seeds or []), *extra] for x in w.split(",") if x]
    except ValueError:
        raise UsageError(f"--seeds takes integers, got {' '.join(seeds or [])}") from None
    from pathlib import Path

    from llmx.core.compare import runner

    spec = host().comparison(name)
    folder = runner.folder_for(spec, model, quick, {"data": data, "sets": list(sets or []), "seeds": chosen,
                                                    "device": device, "dtype": dtype, "onload": onload})
    p = runner.plan(spec, out=Path(output_dir or "comparisons") / spec.name / folder, model=model, data=data,
                    seeds=chosen, quick=quick, sets=list(sets or []), device=device, dtype=dtype, onload=onload)
    result = runner.run(p, progress=False, say=info)
    emit(result, lambda: _render(result, p.out))


def _row(spec) -> dict:
    d = spec.describe()
    return {k: d[k] for k in ("name", "summary", "paper", "target", "arms", "cost", "plugin")}


def _show(d: dict) -> None:
    def render() -> None:
        out = stdout()
        out.print(f"[bold]{d['name']}[/]  plugin: {d['plugin']}   paper: {d['paper']}", highlight=False)
        out.print(d["summary"], highlight=False)
        out.print(f"target: {d['target']}   metric: {d['metric']} ({'higher' if d['higher_is_better'] else 'lower'} "
                  f"is better)   cost: {d['cost']}   seeds: {d['seeds']} (quick: {d['quick_seeds']})", highlight=False)
        out.print(f"evaluation: {d['evaluation']}   default model: {d['model']}   data: {d['data']}", highlight=False)
        table("arms", ["arm", "family", "cost", "stages"],
              [[a["name"], a["family"], a["cost"], "; ".join(f"{s['method']} {s.get('params', {})}"
                                                           for s in a["stages"]) or "(the starting model)"]
               for a in d["arms"]])

    emit(d, render)


def _render(result: dict, out) -> None:
    metric = result["metric"]
    by_name = {v["baseline"]: v for v in result["verdicts"]}
    rows = []
    for a in result["arms"]:
        v = by_name.get(a["name"])
        rows.append([a["name"], a["family"], a["cost"], a[metric],
                     f"{v['improvement']:+.4f} [{v['low']:+.4f}, {v['high']:+.4f}]" if v and v["improvement"] is not None
                     else "-" if v else "(target)" if a["target"] else "(reference)",
                     v["verdict"] if v else ""])
    table(f"{result['comparison']}: {result['target']} against each baseline",
          ["arm", "family", result["cost"], metric, "improvement [95%]", "verdict"], rows)
    stdout().print(f"{result['improvement']}\nresults: {out}/result.json, result.md, result.png", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("compare", epilog=examples(
        "llmx compare list", "llmx compare show gptq", "llmx compare summary comparisons/",
        "llmx compare gptq --quick --model ref:llama-test",
        "llmx compare gptq --model ./my-model --data notes.txt --seeds 0 1 2",
        "llmx compare lexico --model ./my-model --device cuda --dtype bfloat16",
        "llmx compare gptq --set gptq-w4.group_size=64 --set rtn-w4.group_size=64",
        "llmx compare crow --set crow.crow.lr=2e-3"))(compare)
