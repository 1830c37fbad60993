"""What a run trains on: data files and Hub datasets, prompts encoded for the model, the
curriculum that picks each step's prompts."""
