"""Capture: run a model under a TorchDispatchMode and group its ATen calls into operator cards."""
