"""Developer tools: generated docs (``docgen``), the layout survey (``layout``), Debian tools for the tests."""
