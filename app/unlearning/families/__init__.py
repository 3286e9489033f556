"""One module per family (each an ``Unlearner``), with the sibling modules of the families split at their seams."""
