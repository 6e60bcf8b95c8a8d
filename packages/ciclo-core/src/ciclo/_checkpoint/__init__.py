"""Checkpoints: ``_format`` (the on-disk layout, written and read there only), ``_callback``
(``ciclo.checkpoint``), ``_restore`` (``ciclo.restore``, ``restore_best``), ``_resume`` (how
``loop(resume=...)`` continues a run) and ``_in_place`` (the objects a resume updates in
place)."""
