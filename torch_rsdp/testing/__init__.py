"""Test utilities for torch_rsdp (not needed at run time).

`torch_rsdp.testing.netns` emulates several nodes on one Linux host with network namespaces
(root only); see its docstring.
"""
