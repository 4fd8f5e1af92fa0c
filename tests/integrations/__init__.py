"""End-to-end tests with other software: DDP/FSDP2 training, torchft, torchrun restarts, the
examples and the quick benchmark. See README.md."""
