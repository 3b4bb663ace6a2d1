"""Simulator backends: each builds a list of single-env adapters for `LoopVectorEnv`."""
