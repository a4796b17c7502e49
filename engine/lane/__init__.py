"""GPU lanes: one worker process per GPU, one evaluation at a time, replaced when a kernel faults."""
