"""Time: how far a loop has come (``Elapsed``, ``Period``) and when something runs (schedules)."""
