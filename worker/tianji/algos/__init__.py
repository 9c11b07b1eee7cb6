"""Algorithms: what an actor computes per step and what a learner does with a batch."""
