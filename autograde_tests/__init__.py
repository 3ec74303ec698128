"""Attention, Step by Step: reference implementations and graded checks."""
