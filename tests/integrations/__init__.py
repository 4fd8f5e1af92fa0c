"""End-to-end tests with other software: DDP/FSDP2 training, torchft, torchrun restarts, the
examples and the performance guard. See README.md."""
