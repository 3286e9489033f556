"""Accuracy and forgetting (sections ``accuracy`` and ``scale_accuracy``, membership inference); see bench/__init__.py."""
