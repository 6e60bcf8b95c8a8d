"""Several processes: which process writes each output, and how the processes of a job agree
on the loop's decisions (docs/architecture.md)."""
