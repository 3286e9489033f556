"""The engine's contract: the errors, the certificate and the model spec (the ground floor), and the ``Unlearner``
interface (contract/unlearner.py, above the mathematics and the mechanism)."""
