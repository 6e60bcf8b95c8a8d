"""The predefined loops (``train_loop``, ``test_loop``, ``predict_loop``), their moments, and
``evaluate_checkpoints``, which runs ``test_loop`` on each checkpoint of a run."""
