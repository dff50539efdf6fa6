"""The agent: the process on the head node that is the cluster's only Ray driver.

It serves one Unix socket, runs cells as Ray tasks and actors (or in its own driver
namespace) and keeps their output until the notebook has it. Importing this package
imports nothing heavy: Ray is loaded only by the modules that run on the head.
"""
