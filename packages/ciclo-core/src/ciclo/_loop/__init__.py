"""The engine of ``ciclo.loop`` and the callback contract it runs."""
