"""Gradient debugging tools: gradcheck, jacobian, jacobian_fd (filled in by the autograd work)."""
