"""What a loop records: logs of a step, the history of a run, and the device-to-host fetch."""
