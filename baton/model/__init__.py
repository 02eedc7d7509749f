"""The model: the Llama network, its learning-rate schedule and its export."""
