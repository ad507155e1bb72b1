"""Partitioned consumer groups: their layout (pcgroups format) and managing them."""
