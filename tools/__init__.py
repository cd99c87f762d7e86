"""Developer tools: generated docs (``docgen``, ``benchdoc``), the layout survey (``layout``), Debian tools for the tests."""
