"""Pure decision functions of the operator: the gang lifecycle and notice delivery."""
