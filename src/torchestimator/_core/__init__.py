"""The engine: the Estimator and what one train / evaluate / predict call is made of.

estimator.py (the public surface, owns model_dir) builds a run and hands it to
loop.py (the training loop) or eval_loops.py (evaluation, prediction);
state.py is the run's one state object; inference.py the seam the Estimator
hands to export and to evaluations inside training; config.py, spec.py,
calling.py, batches.py, progress.py, finetune.py and module_estimator.py
are the pieces they share. Users import all of it from ``torchestimator``.
"""
