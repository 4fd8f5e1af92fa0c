"""Tests of the cross-node layer on emulated nodes: topology, hierarchical/flat algorithms,
traffic, compression. See README.md."""
