"""The model and its forward: loading (directory, Hub, GGUF), the policy with its reference,
packed rows, compiled layers, the bundled character tokenizer."""
