"""Plugins: what installed packages add to ciclo, through one entry-point group
(``ciclo.adapters``): each registers an ``Adapter`` record, which carries the adapter's
factories and its extras (in-place restore, partition metadata), found lazily."""
