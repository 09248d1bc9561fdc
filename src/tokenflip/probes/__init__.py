"""Mechanism probes: teacher-forced replays that explain why two cells diverged."""
