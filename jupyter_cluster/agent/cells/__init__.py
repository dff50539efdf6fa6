"""Cells on the cluster: each mode's runner, namespaces, values, output, interrupts and what cells started."""
