"""Built-in procedural tasks and dataset loaders."""
