"""Argmax over the last axis (a greedy step's token): reference.py is the definition, cpu.cc the
CPU kernel; api.argmax picks one."""

from pallas_kernels.argmax.api import argmax

__all__ = ["argmax"]
