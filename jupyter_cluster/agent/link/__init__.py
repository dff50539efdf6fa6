"""The agent's end of the link: its socket server, and the synced folders the kernel sends."""
