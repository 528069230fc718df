"""Per-rank memory and step time of ``strategy: ddp`` and ``strategy: fsdp`` at world size 1 and 2, measured on the
CPU under gloo, each figure beside the memory plan's (``llmx.core.train.plan``).

    python benchmarks/bench_scaling.py [--stages sft dpo] [--steps 6] [--rounds 3] [--quick]

One Llama (hidden 256, 4 layers, 4 heads over 2 KV heads, untied embeddings, the byte tokenizer; random weights,
``bench_plan.model_folder``) trains on ``bench_plan.rows``' synthetic rows (every sequence cut to ``--length``
tokens) through ``llmx.core.pipeline.execute``: the real sft stage (and dpo), ``batch_size`` examples per rank, so
world 2 runs twice the global batch of world 1. Each configuration runs in processes started by
``torch.multiprocessing.spawn`` under a gloo process group (``init_method="file://..."``, as
tests/test_train_sharded.py does), one process for world 1 (fsdp needs a process group even there), two for world 2,
``torch.set_num_threads(1)`` in each. llmx is not edited: each process replaces ``llmx.core.train.stage.train`` (the
name ``fit`` calls) and ``llmx.core.train.parallel.wrap`` with wrappers that see the model, the trained tensors, the
optimiser and the engine, and read per rank:

* bytes held, right after the last optimizer step (gradients are still there: the loop frees them with
  ``zero_grad(set_to_none=True)`` at the start of the next step): the model's parameters, the trained tensors'
  ``.grad`` and every tensor in ``optimizer.state`` (AdamW's moments and its step counters), each its local shard
  (``DTensor.to_local()``) under fsdp; a frozen reference copy (dpo); DDP's gradient buckets (the reducer's
  ``bucket_sizes``);
* the peak of tensor bytes held during the training loop, all tensors of the process, counted from before the model
  is loaded: torch's profiler with memory profiling (``llmx.core.memory.PeakMemory``, section around the loop). It
  counts what torch allocates, the quantity the plan models, where RSS would add the interpreter, the libraries
  (several hundred MiB) and whatever the allocator keeps after frees. The profiler slows a run, so this is a pass
  of its own (round 0 only). ``held_before_loop`` is what the process held when the loop began;
* seconds per optimizer step: a second pass without the profiler, the time between successive ends of a step,
  median over the steps after the first, each rank's (they wait for each other in every collective); the
  configurations repeat in ``--rounds`` interleaved rounds and the per-round medians' median is reported.

Two processes on a 2-core machine share its cores with nothing else to give: world 2's step time is not a speedup
claim. Writes benchmarks/results/scaling.json and .md (``--quick``: sft only, 3 steps, one round, scaling_quick.*)
with the CPU (its model and torch's CPU capability) and the load average. About 4 minutes on 2 cores.

Script only: memory and step time of the distributed strategies, no method judged against a baseline on paired items.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plan import model_folder, rows  # noqa: E402
from common import RESULTS, cpu_model, machine, markdown, write  # noqa: E402

MIB = 1 << 20
CONFIGS = [("ddp", 1), ("ddp", 2), ("fsdp", 1), ("fsdp", 2)]


def stage_spec(method: str, data: dict[str, str], strategy: str, steps: int, batch: int, length: int) -> dict:
    params = {"data": data[method], "steps": steps, "batch_size": batch, "warmup": 1, "lr": 1e-3, "save": False,
              "strategy": strategy}
    if method == "sft":
        params.update(max_length=length, max_prompt_length=length // 2)
    else:
        params.update(max_len=length)
    return {"method": method, "params": params}


def raw_run(model: str, spec: dict, out: str) -> dict:
    return {"model": model, "output_dir": out, "seed": 0, "threads": 1, "pipeline": [spec]}


def _local(t: torch.Tensor) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


class Probe:
    """Wrappers of ``fit``'s ``train`` and of ``parallel.wrap`` that read memory and step times per rank."""

    def __init__(self, pm=None):
        self.pm, self.frozen, self.engine, self.held, self.times = pm, [], None, {}, []

    def wrap(self, original):
        def wrap(model, strategy, *args, **kwargs):
            engine = original(model, strategy, *args, **kwargs)
            self.frozen = list(kwargs.get("frozen") or (args[3] if len(args) > 3 else None) or [])
            self.engine = engine
            return engine
        return wrap

    def train(self, original):
        def train(model, named, loss, c, *args, after_step=None, **kwargs):
            self.times = [time.perf_counter()]

            def after(state):
                self.times.append(time.perf_counter())
                if state.done == c.steps:
                    self.held = self.read(model, state)
                if after_step is not None:
                    after_step(state)

            with self.pm.section() if self.pm is not None else nullcontext():
                result = original(model, named, loss, c, *args, after_step=after, **kwargs)
            self.held["optimizer_bytes_reported"] = result.optimizer_bytes
            return result
        return train

    def read(self, model, state) -> dict:
        grads = [p.grad for p in state.named.values() if p.grad is not None]
        moments = [t for st in state.optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        out = {"weights": sum(_local(p) for p in model.parameters()),
               "gradients": sum(_local(g) for g in grads), "gradient_tensors": len(grads),
               "optimizer": sum(_local(t) for t in moments),
               "reference": sum(_local(p) for m in self.frozen for p in m.parameters()),
               "sharded": any(hasattr(p, "to_local") for p in model.parameters())}
        buckets = None
        for ddp in (self.engine.ddp if self.engine is not None else []):
            try:
                sizes = ddp._get_ddp_logging_data().get("bucket_sizes")  # private: the reducer's buckets, bytes
                buckets = (buckets or 0) + sum(int(s) for s in str(sizes).split(", ") if s)
            except Exception:  # noqa: BLE001 - a figure to report, not to fail on
                buckets = None
        out["ddp_buckets"] = buckets
        return out


def one_pass(model: str, spec: dict, out: str, memory: bool) -> dict:
    from llmx.core.config import resolve
    from llmx.core.memory import PeakMemory
    from llmx.core.pipeline import execute
    from llmx.core.plugins import host
    from llmx.core.train import parallel
    from llmx.core.train import stage as stage_module

    run = resolve(raw_run(model, spec, out), host().methods)
    with PeakMemory("cpu") if memory else nullcontext() as pm:
        probe = Probe(pm)
        train, wrap = stage_module.train, parallel.wrap
        stage_module.train, parallel.wrap = probe.train(train), probe.wrap(wrap)
        try:
            metrics = execute(run, show_progress=False).stages[0]["metrics"]
        finally:
            stage_module.train, parallel.wrap = train, wrap
    steps = [b - a for a, b in zip(probe.times, probe.times[1:], strict=False)]
    record = {"held": probe.held, "step_seconds": steps, "final_loss": metrics.get("final_loss")}
    if memory:
        record["tensors_at_start"], record["tensors_peak"] = pm.base_bytes, pm.base_bytes + pm.peak_bytes
    return record


def _worker(rank: int, size: int, init: str, job: str, out: str) -> None:
    os.environ.update(WORLD_SIZE=str(size), RANK=str(rank), LOCAL_RANK=str(rank))
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    torch.set_num_threads(1)
    from llmx.core import plugins

    plugins.configure([])
    spec = json.loads(job)
    try:
        records = {}
        for kind in spec["passes"]:
            records[kind] = one_pass(spec["model"], spec["stage"], str(Path(out) / kind), memory=kind == "memory")
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(records))
    finally:
        torch.distributed.destroy_process_group()


def launch(model: str, stage: dict, size: int, passes: list[str], folder: Path) -> list[dict]:
    folder.mkdir(parents=True)
    job = json.dumps({"model": model, "stage": stage, "passes": passes})
    torch.multiprocessing.spawn(_worker, args=(size, f"file://{folder / 'store'}", job, str(folder)), nprocs=size,
                                join=True)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(size)]


def planned(model: str, spec: dict, size: int):
    from llmx.core.config import resolve
    from llmx.core.plugins import host
    from llmx.core.train.plan import plan_run

    with tempfile.TemporaryDirectory() as tmp:
        ((_, plan),) = plan_run(resolve(raw_run(model, spec, tmp), host().methods), size)
    return plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", nargs="+", default=["sft", "dpo"], choices=["sft", "dpo"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3, help="Timing passes per configuration, interleaved.")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4, help="Examples per micro-batch per rank.")
    ap.add_argument("--length", type=int, default=128, help="Tokens per sequence.")
    ap.add_argument("--quick", action="store_true", help="sft only, 3 steps, one round; writes scaling_quick.")
    args = ap.parse_args()
    if args.quick:
        args.stages, args.steps, args.rounds = ["sft"], 3, 1
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    began, load_before = time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        model = model_folder(Path(tmp) / "model", args.hidden, args.layers, args.length)
        sft, dpo = rows(Path(tmp), args.length, count=args.batch * 2 * args.steps)
        data = {"sft": sft, "dpo": dpo}
        jobs = [(method, strategy, size) for method in args.stages for strategy, size in CONFIGS]
        found: dict[tuple, dict] = {}
        for r in range(args.rounds):  # round 0 also measures memory; every round times
            for job in jobs:
                method, strategy, size = job
                spec = stage_spec(method, data, strategy, args.steps, args.batch, args.length)
                passes = ["memory", "time"] if r == 0 else ["time"]
                t0 = time.perf_counter()
                ranks = launch(model, spec, size, passes, Path(tmp) / f"r{r}_{method}_{strategy}_{size}")
                print(f"round {r} {method} {strategy} world {size}: {time.perf_counter() - t0:.1f} s", flush=True)
                entry = found.setdefault(job, {"ranks": ranks, "timings": [], "plan": planned(model, spec, size)})
                entry["timings"].append([statistics.median(k["time"]["step_seconds"][1:]) for k in ranks])
    out, summary = [], []
    for (method, strategy, size), entry in found.items():
        plan = entry["plan"]
        part = {p.name: p.device for p in plan.parts}
        for rank, k in enumerate(entry["ranks"]):
            held, mem = k["memory"]["held"], k["memory"]
            pgo = held["weights"] + held["gradients"] + held["optimizer"]
            planned_pgo = part["weights"] + part["gradients"] + part["optimizer"]
            out.append({
                "stage": method, "strategy": strategy, "world": size, "rank": rank,
                "weights_MiB": held["weights"] / MIB, "plan_weights_MiB": part["weights"] / MIB,
                "gradients_MiB": held["gradients"] / MIB, "plan_gradients_MiB": part["gradients"] / MIB,
                "optimizer_MiB": held["optimizer"] / MIB, "plan_optimizer_MiB": part["optimizer"] / MIB,
                "p+g+o_MiB": pgo / MIB, "plan_p+g+o_MiB": planned_pgo / MIB,
                "reference_MiB": held["reference"] / MIB, "plan_reference_MiB": part["reference"] / MIB,
                "ddp_buckets_MiB": None if held["ddp_buckets"] is None else held["ddp_buckets"] / MIB,
                "plan_collectives_MiB": part["collectives"] / MIB,
                "peak_MiB": mem["tensors_peak"] / MIB, "plan_peak_MiB": plan.peak()[0] / MIB,
                "step_s": statistics.median(t[rank] for t in entry["timings"]),
                "final_loss": k["time"]["final_loss"],
                "held_before_loop_MiB": mem["tensors_at_start"] / MIB,
                "other_before_loop_MiB": (mem["tensors_at_start"] - held["weights"] - held["reference"]
                                          - (held["ddp_buckets"] or 0)) / MIB,
                "optimizer_MiB_loop_reported": held["optimizer_bytes_reported"] / MIB,
                "sharded": held["sharded"], "gradient_tensors": held["gradient_tensors"],
                "step_seconds_each": [t[rank] for t in entry["timings"]],
                "step_seconds_first_round": k["time"]["step_seconds"],
            })
        one, two = found.get((method, strategy, 1)), found.get((method, strategy, 2))
        if size == 2 and one and two:
            def pgo_of(e):
                h = e["ranks"][0]["memory"]["held"]
                return h["weights"] + h["gradients"] + h["optimizer"]

            summary.append({"stage": method, "strategy": strategy,
                            "p+g+o_rank0_world2_over_world1": pgo_of(two) / pgo_of(one),
                            "plan_p+g+o_world2_over_world1": _plan_pgo(two["plan"]) / _plan_pgo(one["plan"]),
                            "peak_rank0_world2_over_world1": two["ranks"][0]["memory"]["tensors_peak"]
                            / one["ranks"][0]["memory"]["tensors_peak"],
                            "plan_peak_world2_over_world1": two["plan"].peak()[0] / one["plan"].peak()[0],
                            "step_s_rank0_world2_over_world1": statistics.median(t[0] for t in two["timings"])
                            / statistics.median(t[0] for t in one["timings"])})
    cpu = cpu_model()
    capability = torch.backends.cpu.get_cpu_capability()
    name = "scaling_quick" if args.quick else "scaling"
    plans = {f"{m} {s} world {n}": e["plan"].as_dict() for (m, s, n), e in found.items()}
    seconds = time.perf_counter() - began
    parameters = next(iter(found.values()))["plan"].parameters
    write(name, {"benchmark": name, "summary": summary, "plans": plans, "cpu": cpu["cpu_model"],
                 "cpu_capability": capability, "steps": args.steps, "rounds": args.rounds, "hidden": args.hidden,
                 "layers": args.layers, "batch_per_rank": args.batch, "length": args.length,
                 "parameters": parameters, "seconds": seconds, "load_average_1_5_15": {"before": load_before,
                 "after": os.getloadavg()}, "machine": machine(), "rows": out})
    print(write_table(name, out, summary, args, cpu["cpu_model"], capability, parameters, seconds,
                      (load_before[0], os.getloadavg()[0])))


def _plan_pgo(plan) -> int:
    return sum(plan.part(n).device for n in ("weights", "gradients", "optimizer"))


def write_table(name: str, out: list[dict], summary: list[dict], args, cpu: str, capability: str, parameters: int,
                seconds: float, load: tuple[float, float]) -> str:
    columns = ["stage", "strategy", "world", "rank", "weights_MiB", "plan_weights_MiB", "gradients_MiB",
               "plan_gradients_MiB", "optimizer_MiB", "plan_optimizer_MiB", "p+g+o_MiB", "plan_p+g+o_MiB",
               "reference_MiB", "plan_reference_MiB", "ddp_buckets_MiB", "plan_collectives_MiB", "peak_MiB",
               "plan_peak_MiB", "other_before_loop_MiB", "step_s", "final_loss"]
    head = (f"Per-rank memory and step time of strategy ddp and fsdp at world size 1 and 2 (gloo, one thread per "
            f"process), written by benchmarks/bench_scaling.py in {seconds:.0f} s on {cpu} (torch CPU capability "
            f"{capability}), {os.cpu_count()} cores, shared with other work (load average {load[0]:.1f} before, "
            f"{load[1]:.1f} after). A Llama of {parameters / 1e6:.2f}M parameters (hidden "
            f"{args.hidden}, {args.layers} layers, untied embeddings), {', '.join(args.stages)} for {args.steps} "
            f"steps, batch {args.batch} x {args.length} tokens per rank (dpo: pairs), {args.rounds} timing "
            f"round(s). Measured figures are one rank's own tensors (local shards) after the last step; plan_* is "
            f"`llmx.core.train.plan.plan_stage` for the same run and world size. peak: the most tensor bytes the "
            f"process held during the training loop (profiler pass); other_before_loop: tensors held when the loop "
            f"began beyond the weights, the reference and DDP's buckets. step_s: median seconds per optimizer step "
            f"after the first (timing pass, no profiler); at world 2 two processes share the 2 cores, so it is not "
            f"a speedup claim.\n\n")
    ratios = ("\n\nWorld 2 over world 1, rank 0:\n\n" + markdown(list(summary[0]), summary)) if summary else ""
    text = head + markdown(columns, out) + ratios + "\n"
    (RESULTS / f"{name}.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
