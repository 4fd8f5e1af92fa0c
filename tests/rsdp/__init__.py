"""Tests of the RSDP wrapper (torch_rsdp.rsdp): plain modules, Hugging Face models, emulated
nodes. See README.md."""
