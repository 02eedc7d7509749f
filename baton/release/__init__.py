"""Releasing a model: a verified checkpoint published with its model card."""
