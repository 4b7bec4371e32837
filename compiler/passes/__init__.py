"""IR -> IR passes, one per module: each a pure function with a docstring that says what it
expects and guarantees (verify.py checks the IR between them in tests)."""
