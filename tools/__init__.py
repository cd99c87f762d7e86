"""Developer tools that are not part of the installed package (run from a checkout)."""
