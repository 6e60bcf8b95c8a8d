"""Adapter discovery with the real adapters installed side by side."""

from __future__ import annotations

import subprocess
import sys

import ciclo


def test_every_adapter_of_this_repository_is_registered():
    assert {"flax", "haiku", "equinox"} <= set(ciclo.adapters.installed_adapters())


def test_building_a_flax_state_imports_no_other_framework():
    code = """
import sys
import flax.linen as nn, jax.numpy as jnp, optax
import ciclo
state = ciclo.create_state(nn.Dense(2), jnp.zeros((1, 3)), optax.sgd(0.1), losses=None)
assert type(state).__name__ == "FlaxState", type(state)
others = [m for m in ("haiku", "equinox", "ciclo_haiku", "ciclo_equinox") if m in sys.modules]
assert not others, others
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def test_each_adapter_package_names_the_same_public_names_in_its_all():
    import importlib

    for package in ("ciclo_flax", "ciclo_haiku", "ciclo_equinox"):
        module = importlib.import_module(package)
        assert {"adapter", "create_state"} <= set(module.__all__), package
        for name in module.__all__:
            assert hasattr(module, name), f"{package}.{name}"
