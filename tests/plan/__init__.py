"""Tests of torch_rsdp.plan: strategies, mixed plans, the planner and plan.auto, checkpoints,
emulated nodes. See README.md."""
