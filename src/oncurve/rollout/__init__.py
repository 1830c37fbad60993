"""Group sampling: the Sampler protocol and its torch backend."""
