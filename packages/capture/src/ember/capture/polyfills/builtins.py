"""Builtins the interpreter does not model directly, written in Python."""

from __future__ import annotations
