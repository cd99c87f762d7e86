"""Fault injection for tests: a TCP proxy that cuts or slows the path to a server."""
