"""Checkpoints: ``_format`` (the on-disk layout, written and read there only), ``_callback``
(``ciclo.checkpoint``), ``_restore`` (``ciclo.restore``, ``restore_best``), ``_resume`` (how
``loop(resume=...)`` continues a run) and ``_evaluate`` (``ciclo.evaluate_checkpoints``)."""
