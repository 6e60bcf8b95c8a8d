"""Checkpoints: the on-disk format, the ``checkpoint`` callback, restore and exact resume."""
