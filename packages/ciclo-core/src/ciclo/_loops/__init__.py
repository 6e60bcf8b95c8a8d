"""The predefined loops (``train_loop``, ``test_loop``, ``predict_loop``) and their moments."""
