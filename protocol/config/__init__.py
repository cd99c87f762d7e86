"""``pipeline.toml``: its sections (``sections``, ``pipeline``), parsed and checked (``parse``),
overridden by ``CHTXN_*`` variables (``env``), its keys (``keys``) and where each value came from
(``sources``). Architecture: "Processes" and docs/configuration.md.

Imports: protocol.
"""
