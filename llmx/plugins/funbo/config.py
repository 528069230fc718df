"""Parameters of ``analyze --method funbo`` (the search) and ``eval --method acquisition`` (scoring an AF). No torch
or numpy import here: method listings load this module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llmx.core.spec import Params

SUITES = {  # OOD-Bench (notes §2.3); the 2-D dimensions of Sphere, Styblinski-Tang, Weierstrass are a stated choice
    "ood-train": "ackley-1d,levy-1d,schwefel-1d",
    # 1-D Rosenbrock alone is one bowl: programs bunch up and tie on it (the top fifth of two mutate searches took 8
    # and 10 distinct scores of 31), so the rule picks by how fast they hit it; 5 shifted instances each of it and of
    # 1-D Rastrigin (the notes' prototype's, multimodal) spread them (25 and 19 distinct)
    "ood-validation": ",".join(f"{f}#{i}" for f in ("rosenbrock-1d", "rastrigin-1d") for i in range(5)),
    "ood-test": "sphere-2d,styblinski-tang-2d,weierstrass-2d,beale,branin,michalewicz-2d,goldstein-price,hartmann-3,"
                "hartmann-6",
}


class Protocol(Params):
    """The BO protocol every AF is scored under (notes §2.2 steps 4-5)."""

    trials: int = Field(30, ge=1, description="T, trials after the initial (worst) point.")
    beta: float = Field(1.0, ge=0, description="The beta handed to every AF.")
    time_term: Literal["optimum", "found"] = Field("optimum", description="t_found in the score: the trial that hit "
                                                   "the grid's optimum, T when none did (the notes' reading), or the "
                                                   "one that first reached the best value found (rewards stopping "
                                                   "early).")
    grid_points: int | None = Field(None, gt=1, description="Sobol grid size (null: 1,000 in 1-D, 2,048 above).")
    grid_seed: int = Field(0, ge=0, description="The Sobol scramble and the kernel-fit subset.")
    timeout_s: float = Field(30.0, gt=0, description="Wall-clock limit of one program on one problem set "
                             "(FunSearch's 30 s); eval scales it by the problems per function set.")
    memory_mb: int = Field(2048, ge=256, description="Address-space limit of the sandbox's child.")
    workers: int = Field(1, ge=1, description="Programs evaluated at once, each in its own child.")
    unsafe_unconfined: bool = Field(False, description="Run programs with resource limits only, without the "
                                    "kernel's confinement, where this machine cannot confine them (unsafe: the "
                                    "program can write, spawn and connect as you).")



class FunboParams(Protocol):
    """FunBO's search (notes §2.1-2.2): FunSearch's database and prompt around a BO evaluator."""

    sampler: Literal["mutate", "scripted", "hf", "openai"] = Field("mutate", description="mutate: offline AST "
                                                                   "mutation and crossover (not an LLM; labelled "
                                                                   "so); scripted: textbook EI, PI, LCB and variance "
                                                                   "AFs written as programs, proposed in a fixed "
                                                                   "order (not a model; labelled so); hf: the run's "
                                                                   "--model; openai: an OpenAI-compatible "
                                                                   "/v1/completions endpoint.")
    endpoint: str | None = Field(None, description="openai: the server's base URL (e.g. http://127.0.0.1:8000).")
    endpoint_model: str = Field("default", description="openai: the model name the server expects.")
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: the environment variable holding the key, if any.")
    samples: int = Field(200, ge=1, description="Candidate programs sampled in all (the budget).")
    samples_per_prompt: int = Field(12, ge=1, description="B, completions per prompt (the paper's 12).")
    max_new_tokens: int = Field(384, ge=16, description="hf/openai: tokens per completion.")
    temperature: float = Field(1.0, gt=0, description="hf/openai: sampling temperature.")
    islands: int = Field(10, ge=1, description="Islands (FunSearch's 10).")
    functions_per_prompt: int = Field(2, ge=1, description="Programs shown per prompt (FunSearch's 2).")
    cluster_temperature: float = Field(0.1, gt=0, description="T0 of the cluster softmax.")
    cluster_period: int = Field(30_000, ge=1, description="The cluster temperature's period (programs).")
    reset_period: int = Field(10, ge=1, description="Prompts between resets of the weaker half (FunSearch: 4 h).")
    reduce: Literal["mean", "last"] = Field("mean", description="A program's score over the training functions: "
                                            "their mean (FunBO) or the last one's (FunSearch).")
    train: str = Field("ood-train", description="Training functions: a suite or comma-separated names.")
    validation: str = Field("ood-validation", description="Validation functions: a suite or names (NAME#SEED: a "
                            "seeded shifted instance). Default ood-validation: rosenbrock-1d#0-4 and "
                            "rastrigin-1d#0-4, 10 problems (1-D Rosenbrock alone, one bowl, leaves programs tied).")
    top_share: float = Field(0.2, gt=0, le=1, description="The result is the best validation score among this top "
                             "share by training score.")
    seed_af: str = Field("ei", description="The seed program: a baseline name or a .py file.")
    resume: str | None = Field(None, description="A database.json from an earlier search to continue.")


class AcquisitionParams(Protocol):
    """Scoring one AF (a file or a baseline) on a function set, against another with paired statistics."""

    af: str = Field("ei", description="A .py file with acquisition_function, a baseline (ei, ucb, pi, mean, random, "
                    "ood-paper, mes: BoTorch's qMaxValueEntropy on either backend), or found: the AF an earlier "
                    "funbo stage of the run saved.")
    against: str | None = Field("ei", description="The AF compared per problem (paired wins/losses, Wilcoxon p); "
                                "null: none.")
    functions: str = Field("ood-test", description="A suite (ood-train, ood-validation, ood-test) or names "
                           "(NAME#SEED: a seeded shifted instance).")
    instances: int = Field(0, ge=0, description="Seeded scale/shift instances per function (0: the functions "
                           "themselves).")
    instance_seed: int = Field(0, ge=0, description="The first instance's seed.")
    backend: Literal["numpy", "botorch"] = Field("numpy", description="numpy: the grid protocol; botorch: the same "
                                                 "protocol through BoTorch's SingleTaskGP and optimize_acqf_discrete.")
