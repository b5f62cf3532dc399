"""Trainers: one thin GRPOTrainer subclass per method."""
