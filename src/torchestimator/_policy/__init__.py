"""The policy around the training loop: train_and_evaluate (when to evaluate, and what follows), early
stopping, the best-checkpoint record, and the one "is this better" rule (improvement.py) they all use.
Users import it from ``torchestimator``."""
