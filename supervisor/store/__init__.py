"""What is kept: the SQLite store, its schema, and what is pruned from it."""
