"""Chakra execution traces (MLCommons): our schema copy, its generated module, the exporter."""

from prism_megatron.graph.chakra.export import export_chakra

__all__ = ["export_chakra"]
