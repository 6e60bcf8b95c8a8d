"""Time: how far a loop has come (``Elapsed``, ``Period``), the units it counts in and how
amounts of them are checked (``_units``), and when something runs (schedules)."""
