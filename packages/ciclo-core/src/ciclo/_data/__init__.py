"""Datasets that resume exactly through their own iterator state (Grain's
``get_state``/``set_state``), exposed as the ``state_dict``/``load_state_dict`` pair that a
checkpoint saves."""
