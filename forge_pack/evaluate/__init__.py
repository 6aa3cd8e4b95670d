"""Evaluate stage: static checks, compile, object check, verify and time candidates in isolation."""
