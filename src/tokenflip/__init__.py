"""tokenflip: did a change that should not matter change the tokens, where, and why."""

__version__ = "0.1.0"
