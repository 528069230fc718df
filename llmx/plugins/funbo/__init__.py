"""FunBO (Aglietti et al., ICML 2025): FunSearch evolving Bayesian-optimisation acquisition functions as code.

The evolved program is ``acquisition_function(predictive_mean, predictive_var, incumbent, beta=1.0)`` returning a grid
index, seeded with EI (``afs``). ``database`` is FunSearch's islands and clusters, ``prompt`` its prompt and completion
trimming, ``samplers`` the program proposers (``hf``, ``openai``, and two offline ones that are not models:
``mutate`` and ``scripted``, textbook AFs in a fixed order), ``sandbox``/``program`` the untrusted-code runner,
``bo``/``gp`` the evaluator (fixed GP on a Sobol grid, worst point first, FunBO's score), ``botorch_check`` its BoTorch
validation and the MES baseline, ``search`` the loop.

Deviations, each an option: resets every ``reset_period`` prompts rather than every 4 hours; t_found read as the trial
that hit the grid's optimum (``time_term``, ``found`` the other reading); the kernel fitted per base function, shared
by its instances; 1-D Rosenbrock as (1 - x)^2; validation on 5 shifted instances each of 1-D Rosenbrock and 1-D
Rastrigin, not on 1-D Rosenbrock alone (one bowl, on which programs tie); OOD test dimensions of Sphere, Styblinski-Tang,
Weierstrass set to 2.
"""
