"""oncurve: GRPO on verifiable rewards for Hugging Face causal LMs."""

__version__ = "0.1.0"
